"""``outboxkit inbox run`` stopped (SIGTERM) while its group rejoins and the rejoin waits for a
member that is frozen (SIGSTOP): it ends within seconds, and leaves the group.

A third member's join starts a rebalance; the frozen member never rejoins, so the coordinator
holds every other member's JoinGroup until the frozen one's session times out (30 s here).

aiokafka: before, the stop waited for that answer twice over: aiokafka's ``getmany`` waits for
the new assignment whatever its timeout (the loop never saw the stop), then the consumer's
``stop()`` waits for its coordination task, which waits for the JoinGroup answer: 28 s with a
30 s session, 0.5-1.8 s since. Its LeaveGroup goes over another connection, so it has left at
the exit.

confluent-kafka: librdkafka's close sends its LeaveGroup over the coordinator connection, where
the broker reads nothing more until it has answered the held JoinGroup; librdkafka gives a
LeaveGroup 5 s (not configurable), then ends: the stop takes about 5 s and the member is still
listed at the exit. The broker reads that LeaveGroup all the same (Kafka serves what a closed
connection sent before it closed) right after the JoinGroup is answered, so the group settles
without it when the frozen member is evicted, as with aiokafka: the others never wait for the
stopped member's own session (90 s here), which a member that did not leave would cost them.
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
FROZEN_SESSION_MS = 30_000
STOPPED_WITHIN = 8.0  # seconds; a stop outside a rebalance takes about one
# The stopped member's session, ms: had it not left, the others would wait for this too.
STOPPED_SESSION_MS = 90_000
# Seconds from the SIGTERM to the group settled with the third member alone: the frozen
# member's session and a margin (a member that did not leave: that and STOPPED_SESSION_MS).
SETTLED_WITHIN = FROZEN_SESSION_MS / 1000 + 15


def _group(bootstrap: str, group: str) -> tuple[ConsumerGroupState, int] | None:
    """The group's state and member count; ``None`` while it is not known yet."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    (future,) = admin.describe_consumer_groups([group], request_timeout=10).values()
    try:
        found = future.result()
    except KafkaException:
        return None
    return found.state, len(found.members)


# Per adapter: the session option's name, the stopped member's own options (librdkafka logs its
# requests only when asked), the DEBUG line that says its JoinGroup went out, and the members
# listed right after the exit (librdkafka's LeaveGroup still waits behind its JoinGroup).
_CLIENT = {
    "aiokafka": ("session_timeout_ms", (), b"Sending JoinGroup", 2),
    "confluent": (
        "session.timeout.ms",
        ("--kafka-option", "debug=cgrp,protocol"),
        b"Sent JoinGroupRequest",
        3,
    ),
}


def test_sigterm_while_a_rejoin_waits_for_a_frozen_member(
    adapter: str,
    spawn: Callable[..., Worker],
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
) -> None:
    topic, group = outboxkit_topic(partitions=3), f"g-{uuid.uuid4().hex[:8]}"

    def stable(members: int) -> bool:
        return _group(outboxkit_kafka_bootstrap, group) == (ConsumerGroupState.STABLE, members)

    session, debug, join_sent, listed = _CLIENT[adapter]
    # -vv: the client's DEBUG lines say when the JoinGroup goes out.
    options = ("--kafka-option", f"{session}={STOPPED_SESSION_MS}", *debug)
    stopped = spawn(topic, group=group, verbose=2, args=options)
    wait_for(lambda: stable(1), what="the first member")
    frozen_session = f"{session}={FROZEN_SESSION_MS}"
    frozen = spawn(topic, group=group, args=("--kafka-option", frozen_session))
    try:
        wait_for(lambda: stable(2), what="two members")
        frozen.proc.send_signal(signal.SIGSTOP)
        seen = stopped.log.stat().st_size
        spawn(topic, group=group)  # its join starts the rebalance
        wait_for(
            lambda: join_sent in stopped.log.read_bytes()[seen:],
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
        # The rejoin still waits for the frozen member, the third one with it (and with
        # confluent-kafka the stopped one, its LeaveGroup not read yet).
        preparing = ConsumerGroupState.PREPARING_REBALANCING
        assert _group(outboxkit_kafka_bootstrap, group) == (preparing, listed), f"{took:.1f} s"
        # It left: once the frozen member is evicted, the third one is alone, long before the
        # stopped member's own session would have ended.
        wait_for(
            lambda: stable(1),
            timeout=began + SETTLED_WITHIN - time.monotonic(),
            what="the group settled without the stopped member",
        )
    finally:
        frozen.proc.kill()
