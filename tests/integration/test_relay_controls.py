"""Cross-process controls: the pause flag, and ``relay status``."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from outboxkit.cli import main
from outboxkit.relay.reader import ShardStore
from tests.relay_support import (
    insert_rows,
    payloads,
    relay_settings,
    row_states,
    running_relay,
    set_shard_count,
)
from tests.support.waiting import wait_for_async

pytestmark = pytest.mark.integration

TopicFactory = Callable[..., str]


def _cli(db_url: str, *args: str) -> str:
    result = CliRunner().invoke(main, list(args), env={"OUTBOXKIT_DATABASE_URL": db_url})
    assert result.exit_code == 0, result.output
    return result.output


async def test_pause_flag_is_obeyed_and_resume_continues(
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    topic = outboxkit_topic()
    set_shard_count(outboxkit_db_url, 2)
    settings = relay_settings(outboxkit_db_url, outboxkit_kafka_bootstrap, poll_interval=0.5)
    reads: list[tuple[ShardStore, bool]] = []  # every read of the pause flag, by whose store
    read_flag = ShardStore.paused

    async def counted(store: ShardStore, conn: Any, group: str) -> bool:
        paused = await read_flag(store, conn, group)
        reads.append((store, paused))
        return paused

    monkeypatch.setattr(ShardStore, "paused", counted)
    async with running_relay(settings) as relay:
        insert_rows(outboxkit_db_url, topic, payloads("a", 5))
        await wait_for_async(lambda: row_states(outboxkit_db_url) == {"published": 5})
        await wait_for_async(lambda: all(w.active.is_set() for w in relay.workers.values()))
        assert "paused" in _cli(outboxkit_db_url, "relay", "pause", "--reason", "incident 42")
        await wait_for_async(lambda: all(w.paused for w in relay.workers.values()))
        insert_rows(outboxkit_db_url, topic, payloads("b", 5))
        # A paused worker claims nothing between two reads of the flag: two reads by every
        # worker since the insert are a whole loop in which the new rows were left alone.
        since = len(reads)
        await wait_for_async(
            lambda: all(
                sum(1 for store, paused in reads[since:] if store is w._store and paused) >= 2
                for w in relay.workers.values()
            ),
            what="every worker read the pause flag twice since the insert",
        )
        assert row_states(outboxkit_db_url) == {"published": 5, "pending": 5}
        status = json.loads(_cli(outboxkit_db_url, "relay", "status", "--json"))
        assert status["paused"] is True
        assert sum(s["backlog"] for s in status["shards"]) == 5
        assert "resumed" in _cli(outboxkit_db_url, "relay", "resume")
        await wait_for_async(lambda: row_states(outboxkit_db_url) == {"published": 10})


async def test_status_shows_holder_token_backlog_and_age(
    outboxkit_db_url: str, outboxkit_kafka_bootstrap: str, outboxkit_topic: TopicFactory
) -> None:
    topic = outboxkit_topic()
    set_shard_count(outboxkit_db_url, 3)
    insert_rows(outboxkit_db_url, topic, payloads("a", 4))
    before = json.loads(_cli(outboxkit_db_url, "relay", "status", "--json"))
    assert [s["shard"] for s in before["shards"]] == [0, 1, 2]
    assert all(s["holder"] is None and not s["active"] for s in before["shards"])
    assert sum(s["backlog"] for s in before["shards"]) == 4
    busy = [s for s in before["shards"] if s["backlog"]]
    assert busy[0]["oldest_pending_seconds"] >= 0
    settings = relay_settings(outboxkit_db_url, outboxkit_kafka_bootstrap, shards=(0, 1, 2))
    async with running_relay(settings) as relay:
        await wait_for_async(lambda: row_states(outboxkit_db_url) == {"published": 4})
        after = json.loads(_cli(outboxkit_db_url, "relay", "status", "--json"))
        assert all(s["active"] and s["holder"] == relay.holder for s in after["shards"])
        assert all(s["backlog"] == 0 and s["token"] for s in after["shards"])
        text = _cli(outboxkit_db_url, "relay", "status")
        lines = [line for line in text.splitlines() if relay.holder in line]
        assert len(lines) == 3
        assert all(re.search(r" \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ ", line) for line in lines)


def test_control_commands_read_a_toml_file(outboxkit_db_url: str, tmp_path: Path) -> None:
    config = tmp_path / "relay.toml"
    config.write_text('[kafka]\nbootstrap = "unused:9092"\n[relay]\ngroup = "blue"\n')
    _cli(outboxkit_db_url, "relay", "--config", str(config), "pause", "--reason", "drill")
    # The connection options are accepted after the command as well.
    status = json.loads(
        _cli(outboxkit_db_url, "relay", "status", "--config", str(config), "--json")
    )
    assert status["group"] == "blue"
    assert status["paused"] is True
    other = json.loads(_cli(outboxkit_db_url, "relay", "status", "--json"))
    assert other["group"] == "default"
    assert other["paused"] is False
