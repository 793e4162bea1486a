"""``outboxkit demo`` as a user runs it: a process whose screen shows the story and the verdict.

The demo runs against this session's PostgreSQL and Kafka (named by the ``OUTBOXKIT_*``
variables, as a user with running services would) with fewer orders than the default, so it
stays short; the kills, the takeover and the checks are the same.
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.support.demo_command import run_demo, verification_table
from tests.support.env import service_env

# What leaks when a client or a logger writes to the screen: "INFO:outboxkit.relay...",
# librdkafka's "%4|1700000000.123|...", a JSON log line, a traceback.
RAW_LOG = re.compile(
    r"^(DEBUG|INFO|WARNING|ERROR|CRITICAL)[: ]|%\d\|\d|librdkafka|aiokafka|Traceback|^\{\"ts\"",
    re.MULTILINE,
)


def test_demo_shows_takeover_and_suppressed_duplicate_all_green(
    outboxkit_db_url: str, outboxkit_kafka_bootstrap: str, tmp_path: Path
) -> None:
    env = service_env(outboxkit_db_url, outboxkit_kafka_bootstrap)
    logs = tmp_path / "logs"
    out = run_demo(env, logs)
    # A unless an overloaded A lost its lease to B before the kill (then the roles swap).
    assert re.search(r"SIGKILL relay [AB] \(pid \d+\) after it published \d+", out), out
    assert re.search(r"relay [AB] took over \d+\.\ds after the kill", out), out
    assert "consumer killed after committing its DB transaction" in out, out
    assert "the inbox recognised the redelivered event" in out, out
    table = verification_table(out)
    # The kill came after a batch's commit: its redelivered events (one or more) were suppressed.
    suppressed = re.search(r"redeliveries suppressed by the inbox: (\d+)", table)
    assert suppressed is not None, table
    assert int(suppressed[1]) >= 1, table
    assert "read back from Kafka (read_committed): 0 duplicate record(s)" in table
    assert not RAW_LOG.search(out), out
    # The relays' and the consumer's logs went to the files the demo named instead.
    assert f"logs: {logs}" in out
    assert "acquired lease of shard 0" in (logs / "relay-B.log").read_text()
    assert "fault point after_db_commit" in (logs / "consumer.log").read_text()
