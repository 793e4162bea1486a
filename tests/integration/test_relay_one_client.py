"""Each Kafka extra alone is enough for the relay: ``outboxkit relay run`` (exactly-once) in a
process where the other client library cannot be imported publishes rows a ``read_committed``
reader sees; a client that is missing gives a one-line error naming the extra to install."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

import pytest

from tests.relay_support import (
    ROOT,
    RelayProcess,
    assert_exactly_once_in_order,
    consume,
    insert_rows,
    payloads,
    row_states,
    set_shard_count,
)
from tests.support.blocking import env_without
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

TopicFactory = Callable[..., str]
LIBRARIES = {"confluent": "confluent_kafka", "aiokafka": "aiokafka"}


@pytest.mark.parametrize(
    ("only", "blocked"), [("aiokafka", "confluent_kafka"), ("confluent", "aiokafka")]
)
def test_relay_runs_exactly_once_with_only_one_client_installed(
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
    processes: list[RelayProcess],
    only: str,
    blocked: str,
) -> None:
    topic = outboxkit_topic(partitions=2)
    set_shard_count(outboxkit_db_url, 2)
    expected = payloads("a", 15) + payloads("b", 15)
    insert_rows(outboxkit_db_url, topic, expected)
    relay = RelayProcess(
        outboxkit_db_url,
        outboxkit_kafka_bootstrap,
        ["--mode", "exactly_once"],
        base_env=env_without(blocked),  # no OUTBOXKIT_KAFKA_CLIENT: the installed one is found
    ).start()
    processes.append(relay)
    wait_for(
        lambda: row_states(outboxkit_db_url) == {"published": len(expected)},
        timeout=90,
        what=f"published with only {only}",
    )
    assert f"Kafka client {only}" in relay.log(), relay.log()
    assert_exactly_once_in_order(
        consume(outboxkit_kafka_bootstrap, topic, expect=len(expected)), expected
    )


def _run_without(blocked: tuple[str, ...], *extra_env: tuple[str, str]) -> tuple[int, str]:
    env = env_without(*blocked)
    for name in [n for n in env if n.startswith("OUTBOXKIT_") and "BLOCK" not in n]:
        del env[name]
    env.update(
        {
            "OUTBOXKIT_DATABASE_URL": "postgresql://u:s3cret@127.0.0.1:1/db",
            "OUTBOXKIT_KAFKA_BOOTSTRAP": "127.0.0.1:9",
            **dict(extra_env),
        }
    )
    done = subprocess.run(
        [sys.executable, "-m", "outboxkit.relay", "run"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return done.returncode, done.stdout + done.stderr


@pytest.mark.parametrize("missing", sorted(LIBRARIES))
def test_a_missing_client_is_a_one_line_error_naming_the_extra(missing: str) -> None:
    code, out = _run_without((LIBRARIES[missing],), ("OUTBOXKIT_KAFKA_CLIENT", missing))
    assert code == 1, out
    assert out.strip().count("\n") == 0, out
    assert f"pip install 'outboxkit[{missing}]'" in out
    assert "Traceback" not in out
    assert "s3cret" not in out


def test_no_client_at_all_is_a_one_line_error_naming_both_extras() -> None:
    code, out = _run_without(tuple(LIBRARIES.values()))
    assert code == 1, out
    assert out.strip().count("\n") == 0, out
    assert "outboxkit[confluent]" in out
    assert "outboxkit[aiokafka]" in out
