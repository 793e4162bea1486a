"""``outboxkit inbox run`` (aiokafka) stopped (SIGTERM) while its group rejoins and the rejoin
waits for a member that is frozen (SIGSTOP): it ends within seconds, and leaves the group.

A third member's join starts a rebalance; the frozen member never rejoins, so the coordinator
holds every other member's JoinGroup until the frozen one's rebalance timeout (its session
timeout, 45 s here). Before, the stop waited for that answer twice over: aiokafka's ``getmany``
waits for the new assignment whatever its timeout (the loop never saw the stop), then the
consumer's ``stop()`` waits for its coordination task, which waits for the JoinGroup answer:
28 s with a 30 s session, 0.5-1.8 s since.
"""

from __future__ import annotations

import signal
import time
import uuid
from collections.abc import Callable

import pytest
from confluent_kafka import ConsumerGroupState, KafkaException
from confluent_kafka.admin import AdminClient

from tests.fault.inbox_workers import Worker
from tests.support.waiting import wait_for

pytestmark = pytest.mark.fault

TopicFactory = Callable[..., str]
# The frozen member's session (so rebalance) timeout, ms: how long the others' joins wait.
FROZEN_SESSION_MS = 45_000
STOPPED_WITHIN = 8.0  # seconds; a stop outside a rebalance takes about one


def _group(bootstrap: str, group: str) -> tuple[ConsumerGroupState, int] | None:
    """The group's state and member count; ``None`` while it is not known yet."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    (future,) = admin.describe_consumer_groups([group], request_timeout=10).values()
    try:
        found = future.result()
    except KafkaException:
        return None
    return found.state, len(found.members)


@pytest.mark.parametrize("adapter", ["aiokafka"])
def test_sigterm_while_a_rejoin_waits_for_a_frozen_member(
    spawn: Callable[..., Worker],
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
) -> None:
    topic, group = outboxkit_topic(partitions=3), f"g-{uuid.uuid4().hex[:8]}"

    def stable(members: int) -> bool:
        return _group(outboxkit_kafka_bootstrap, group) == (ConsumerGroupState.STABLE, members)

    # -vv: aiokafka's DEBUG lines say when the JoinGroup goes out.
    stopped = spawn(topic, group=group, verbose=2)
    wait_for(lambda: stable(1), what="the first member")
    frozen_session = f"session_timeout_ms={FROZEN_SESSION_MS}"
    frozen = spawn(topic, group=group, args=("--kafka-option", frozen_session))
    try:
        wait_for(lambda: stable(2), what="two members")
        frozen.proc.send_signal(signal.SIGSTOP)
        seen = stopped.log.stat().st_size
        spawn(topic, group=group)  # its join starts the rebalance
        wait_for(
            lambda: b"Sending JoinGroup" in stopped.log.read_bytes()[seen:],
            what="the first member rejoining",
        )
        began = time.monotonic()
        stopped.proc.send_signal(signal.SIGTERM)
        code = stopped.wait_exit(timeout=120)
        took = time.monotonic() - began
        log = stopped.output(tail=1_000_000)
        assert code == 0, log
        assert took < STOPPED_WITHIN, f"{took:.1f} s\n{log}"
        for said in ("Traceback", "never retrieved", "Unclosed", "was destroyed"):
            assert said not in log, log
        # It left: the rejoin still waits for the frozen member, the third one with it.
        preparing = ConsumerGroupState.PREPARING_REBALANCING
        assert _group(outboxkit_kafka_bootstrap, group) == (preparing, 2)
    finally:
        frozen.proc.kill()
