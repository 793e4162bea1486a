"""``outboxkit inbox show|stats|cancel|purge`` against a real database."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable

import psycopg
import pytest
from click.testing import CliRunner
from sqlalchemy import create_engine

from outboxkit.cli import main
from outboxkit.inbox import Envelope, Inbox, InboxSettings
from tests.integration.inbox_support import EFFECT_DDL, REGISTRY, claim, headers_for, payload

pytestmark = pytest.mark.integration


@pytest.fixture
def seeded(outboxkit_db_url: str, sa_url: str) -> dict[str, str]:
    """One succeeded event (seen twice), one processing, one rejection, for consumer billing."""
    with psycopg.connect(outboxkit_db_url) as conn:
        conn.execute(EFFECT_DDL)
    engine = create_engine(sa_url)
    done, running = str(uuid.uuid4()), str(uuid.uuid4())
    inbox = Inbox(
        engine, lambda e, c, s: None, InboxSettings(consumer="billing", registry=REGISTRY)
    )
    try:
        for offset, (event_id, amount) in enumerate([(done, 1), (done, 1), (done, 2)]):
            env = Envelope.from_parts(
                topic="orders",
                partition=0,
                offset=offset,
                key=b"k",
                value=payload("o", amount),
                headers=headers_for(event_id),
            )
            inbox.process(env)
        running_env = Envelope.from_parts(
            topic="orders",
            partition=0,
            offset=9,
            key=b"k",
            value=payload("o", 3),
            headers=headers_for(running),
        )
        claim(engine, inbox.core.statements, running_env)
    finally:
        inbox.close()
        engine.dispose()
    return {"done": done, "running": running, "url": outboxkit_db_url}


def _run(args: list[str], url: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["inbox", *args], env={"OUTBOXKIT_DATABASE_URL": url})
    return result.exit_code, result.output


def test_stats_counts_states_per_consumer(seeded: dict[str, str]) -> None:
    code, out = _run(["stats", "--json"], seeded["url"])
    assert code == 0, out
    rows = {(r["consumer"], r["state"]): (r["events"], r["duplicates"]) for r in json.loads(out)}
    assert rows == {
        ("billing", "processing"): (1, 0),
        ("billing", "succeeded"): (1, 1),
        ("billing", "rejection_log"): (1, 0),
    }
    code, text_out = _run(["stats"], seeded["url"])
    assert code == 0
    assert "succeeded" in text_out
    assert "rejection_log" in text_out


def test_show_lists_details_and_rejections(seeded: dict[str, str]) -> None:
    code, out = _run(
        ["show", "--json", "--consumer", "billing", "--state", "succeeded"], seeded["url"]
    )
    assert code == 0, out
    assert [r["event_id"] for r in json.loads(out)] == [seeded["done"]]
    code, out = _run(["show", "--consumer", "billing", "--event-id", seeded["done"]], seeded["url"])
    assert code == 0, out
    assert "succeeded" in out
    assert "duplicate_count   1" in out
    code, out = _run(["show", "--rejections", "--json"], seeded["url"])
    assert code == 0, out
    [rejection] = json.loads(out)
    assert rejection["event_id"] == seeded["done"]
    assert "different content" in rejection["reason"]
    code, out = _run(["show", "--consumer", "billing", "--event-id", "nope"], seeded["url"])
    assert code == 1
    assert "no inbox row" in out


def test_cancel_makes_a_processing_event_cancelled_once(seeded: dict[str, str]) -> None:
    args = ["cancel", "--consumer", "billing", "--event-id", seeded["running"]]
    code, out = _run(args, seeded["url"])
    assert (code, out.strip()) == (0, f"billing/{seeded['running']}: cancelled")
    code, out = _run(args, seeded["url"])
    assert code == 1
    assert "already ended: cancelled" in out
    unseen = ["cancel", "--consumer", "billing", "--event-id", "future-1"]
    code, out = _run(unseen, seeded["url"])
    assert code == 1
    assert "not seen yet" in out
    code, out = _run([*unseen, "--before-delivery"], seeded["url"])
    assert code == 0, out


def test_purge_keeps_recent_rows(seeded: dict[str, str]) -> None:
    code, out = _run(["purge", "--older-than", "3600", "--all-consumers"], seeded["url"])
    assert code == 0, out
    assert "deleted 0 inbox rows and 0 rejections" in out
    code, out = _run(["purge", "--older-than", "0", "--all-consumers"], seeded["url"])
    assert code == 2  # a zero window would forget events finished just now
    assert "0<x<=" in out
    with psycopg.connect(seeded["url"]) as conn:
        conn.execute("UPDATE outboxkit.inbox_message SET finished_at = finished_at - interval '2h'")
        conn.execute("UPDATE outboxkit.inbox_rejection SET created_at = created_at - interval '2h'")
    code, out = _run(
        ["purge", "--older-than", "3600", "--batch-size", "1", "--all-consumers"], seeded["url"]
    )
    assert code == 0, out
    assert "deleted 1 inbox rows and 1 rejections" in out
    with psycopg.connect(seeded["url"]) as conn:
        left = conn.execute("SELECT state FROM outboxkit.inbox_message").fetchall()
    assert left == [("processing",)]


def test_run_names_missing_and_invalid_settings_without_echoing_values(
    outboxkit_db_url: str,
) -> None:
    runner = CliRunner()
    env = {"OUTBOXKIT_DATABASE_URL": outboxkit_db_url, "OUTBOXKIT_CONSUMER_GROUP": "g"}
    result = runner.invoke(main, ["inbox", "run", "--topic", "t"], env=env)
    assert result.exit_code == 1
    assert "OUTBOXKIT_CONSUMER_NAME, OUTBOXKIT_CONSUMER_REGISTRY" in result.output
    bad = {**env, "OUTBOXKIT_CONSUMER_MAX_ATTEMPTS": "s3cret-typo"}
    result = runner.invoke(main, ["inbox", "run"], env=bad)
    assert result.exit_code == 1
    assert "max_attempts" in result.output
    assert "s3cret-typo" not in result.output


def test_show_prints_control_characters_and_escape_sequences_escaped(
    outboxkit_db_url: str,
) -> None:
    consumer, hostile = f"c-{uuid.uuid4().hex[:6]}", "pay\x1b]0;owned\x07\x1b[2J\nment"
    with psycopg.connect(outboxkit_db_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO outboxkit.inbox_rejection"
            " (consumer, event_id, reason, event_type, topic, kafka_partition, kafka_offset)"
            " VALUES (%s, %s, %s, %s, 't', 0, 0)",
            (consumer, "e-1", f"unknown event type {hostile}", hostile),
        )
        conn.execute(
            "INSERT INTO outboxkit.inbox_message"
            " (consumer, event_id, state, last_error, finished_at)"
            " VALUES (%s, 'e-1', 'dead', %s, now())",
            (consumer, hostile),
        )
    for args in (
        ["show", "--rejections", "--consumer", consumer],
        ["show", "--consumer", consumer],
        ["show", "--consumer", consumer, "--event-id", "e-1"],
    ):
        code, output = _run(args, outboxkit_db_url)
        assert code == 0, output
        assert "\x1b" not in output
        assert "\x07" not in output
        assert "\\x1b]0;owned\\x07\\x1b[2J\\nment" in output


@pytest.mark.parametrize("client", ["confluent", "aiokafka"])
def test_run_stops_at_once_naming_a_missing_dead_letter_topic(
    client: str,
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: Callable[..., str],
) -> None:
    topic = outboxkit_topic()
    env = {
        "OUTBOXKIT_DATABASE_URL": outboxkit_db_url,
        "OUTBOXKIT_KAFKA_BOOTSTRAP": outboxkit_kafka_bootstrap,
        "OUTBOXKIT_CONSUMER_NAME": "billing",
        "OUTBOXKIT_CONSUMER_GROUP": f"g-{uuid.uuid4().hex[:8]}",
    }
    args = ["inbox", "run", "--adapter", client, "--topic", topic]
    args += ["--registry", "tests.integration.inbox_support:REGISTRY"]
    result = CliRunner().invoke(main, args, env=env)
    assert result.exit_code == 1, result.output
    assert f"dead-letter topic '{topic}.dlq' does not exist" in result.output
