"""What the consumer carries over when it replaces a client that keeps refusing seeks.

The new member starts every partition at its committed offset: the held offsets are committed
before the old client goes (none committed yet would mean ``auto.offset.reset``), and this
member's holds and failure counts go over to the new client's first assignment.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, cast

import pytest
from sqlalchemy import create_engine

from outboxkit.errors import ConfigurationError, PublishError
from outboxkit.inbox import Envelope, EventRegistry, Inbox, InboxSettings, OutcomeKind
from outboxkit.inbox import kafka_steps as kafka_steps_module
from outboxkit.inbox.gate import SEEK_ATTEMPTS
from outboxkit.inbox.kafka_steps import kafka_steps
from outboxkit.inbox.outcome import Outcome
from outboxkit.inbox.rejoin import COMMIT_ATTEMPTS
from outboxkit.inbox.steps import (
    Commit,
    Pause,
    Plan,
    Resume,
    Seek,
    Sleep,
    Sql,
    Step,
)
from outboxkit.kafka import aiokafka_consumer
from outboxkit.kafka.aiokafka_consumer import AiokafkaGroupConsumer
from outboxkit.settings import KafkaSettings
from tests.unit.test_inbox_core import Script, _record
from tests.unit.test_inbox_seek_recovery import HELD, OTHER, Refusing

pytestmark = pytest.mark.unit


def _commits(refusing: Refusing) -> list[dict[Any, int]]:
    return [dict(s.offsets) for s in refusing.script.steps if isinstance(s, Commit)]


def test_the_held_offset_is_committed_before_the_rejoin_with_offsets_committed_per_record() -> None:
    refusing = Refusing(offset_commit_interval=0.0)
    refusing.hold()
    assert _commits(refusing) == [{OTHER: 4}]  # 1/3, at once
    assert refusing.refuse_until_rejoined() == SEEK_ATTEMPTS
    assert _commits(refusing) == [{OTHER: 4}, {HELD: 5}]
    close = refusing.script.names().index("CloseConsumer")
    assert isinstance(refusing.script.steps[close - 1], Commit)


def test_no_rejoin_while_the_held_offsets_cannot_be_committed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    refusing = Refusing()
    refusing.hold()
    refusing.commit_fails = 1
    with caplog.at_level("WARNING", logger="outboxkit.inbox.consumer"):
        for _ in range(SEEK_ATTEMPTS):
            refusing.now = refusing.loop.gate.next_due() or refusing.now
            refusing.poll()
    assert "CloseConsumer" not in refusing.script.names()  # the client and its pause stay
    assert refusing.loop.gate.held == frozenset({HELD})
    assert refusing.loop.assigned == {HELD, OTHER}
    assert any("not rejoining the group: committing the held" in m for m in caplog.messages)
    # The next refused seek tries the rejoin again; the settled offset of 1/3 was kept.
    refusing.now = refusing.loop.gate.next_due() or refusing.now
    refusing.poll()
    assert _commits(refusing) == [{OTHER: 4, HELD: 5}] * 2
    assert refusing.script.names().count("CloseConsumer") == 1


def test_a_held_record_that_left_the_log_before_the_rejoin_still_ends_dead() -> None:
    refusing = Refusing()
    refusing.hold()
    refusing.refuse_until_rejoined()
    refusing.polls = [[_record(0, 7)]]  # 0/5 and 0/6 are gone: the log starts at 7
    refusing.poll()
    refusing.poll()
    assert refusing.seen[-1] == (0, 7)
    gone = [s for s in refusing.script.steps if isinstance(s, Sql)]
    assert [s.query.name for s in gone] == ["abandon_gone"]
    assert gone[0].params["event_id"] == "e"
    assert gone[0].params["kafka_offset"] == 5


def test_a_record_failing_outside_its_handler_is_given_up_across_rejoins() -> None:
    refusing = Refusing(max_unexpected_errors=2, offset_commit_interval=0.0)

    def deliver(env: Envelope, *args: Any) -> Plan[Outcome]:
        yield from ()
        refusing.seen.append((env.partition, env.offset))
        raise RuntimeError("a value the database refuses")

    refusing.loop.core.deliver = deliver  # type: ignore[method-assign]
    refusing.polls = [[_record(0, 5)]]
    outcomes = [refusing.poll()]
    refusing.refuse_until_rejoined()
    refusing.polls = [[_record(0, 5)]]
    outcomes.append(refusing.poll())
    assert refusing.seen == [(0, 5), (0, 5)]
    assert outcomes == [OutcomeKind.RETRY, OutcomeKind.REJECTED]  # counted 1, then 2


def test_what_the_old_client_assigns_during_the_rejoin_is_not_kept() -> None:
    refusing = Refusing()
    refusing.hold()
    answer = refusing.answer

    def late_rebalance(step: Step) -> Any:
        if isinstance(step, Commit) and "Seek" in refusing.script.names():
            refusing.loop.on_assign([("orders", 2)])  # the old client's, completing meanwhile
        return answer(step)

    refusing.script.answer = late_rebalance
    refusing.refuse_until_rejoined()
    assert refusing.loop.assigned == {HELD, OTHER}  # the new client's assignment only


def test_a_hold_whose_back_off_runs_on_keeps_it_across_the_rejoin() -> None:
    refusing = Refusing()
    refusing.hold()
    refusing.loop.gate.hold(OTHER, 3, due=refusing.now + 100, event_id="o")
    refusing.refuse_until_rejoined()
    assert refusing.loop.gate.held == frozenset({HELD, OTHER})
    refusing.polls = [[_record(0, 5), _record(1, 3)]]
    refusing.poll()
    refusing.poll()
    assert refusing.seen[-1] == (0, 5)  # 1/3 dropped: its back-off is not over
    pauses = [s for s in refusing.script.steps if type(s) is Pause]
    assert pauses[-1] == Pause([OTHER])  # the new client resumed it on assignment
    refusing.script.answer = lambda s: isinstance(s, Seek) or refusing.answer(s)
    refusing.now += 100
    refusing.polls = [[_record(1, 3)]]
    refusing.poll()
    assert refusing.script.steps[-4:-2] == [Seek(OTHER, 3), Resume([OTHER])]
    assert refusing.seen[-1] == (1, 3)


def test_a_client_that_fails_to_close_is_replaced_all_the_same(
    caplog: pytest.LogCaptureFixture,
) -> None:
    refusing = Refusing()
    refusing.hold()
    answer = refusing.answer

    def failing_close(step: Step) -> Any:
        if type(step).__name__ == "CloseConsumer":
            raise RuntimeError("Consumer closed")
        return answer(step)

    refusing.script.answer = failing_close
    with caplog.at_level("WARNING", logger="outboxkit.inbox.consumer"):
        refusing.refuse_until_rejoined()
    names = refusing.script.names()
    close = names.index("CloseConsumer")
    assert names[close + 1] == "Subscribe"
    assert refusing.loop.assigned == {HELD, OTHER}
    assert "closing the client to replace failed: RuntimeError: Consumer closed" in caplog.messages


class _FakeClient:
    """An aiokafka client whose stop takes until ``release`` is set."""

    def __init__(self, **options: Any) -> None:
        self.listener: Any = None
        self.release = asyncio.Event()
        self.stopping = asyncio.Event()
        self.stopped = False

    def subscribe(self, topics: list[str], listener: Any) -> None:
        self.listener = listener

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        self.stopping.set()
        await self.release.wait()
        self.stopped = True


def test_a_closed_aiokafka_clients_rebalance_callbacks_do_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def scenario() -> list[Any]:
        monkeypatch.setattr(aiokafka_consumer, "AIOKafkaConsumer", _FakeClient)
        consumer = AiokafkaGroupConsumer(KafkaSettings(bootstrap="127.0.0.1:9"), "g")
        calls: list[Any] = []
        await consumer.subscribe(["t"], calls.append, lambda tps: calls.append(tps) or {})
        client: Any = consumer._consumer
        client.release.set()
        await consumer.close()
        # A join the closing client finished (aiokafka runs it inside stop): not the owner's.
        await client.listener.on_partitions_assigned([aiokafka_consumer.TopicPartition("t", 0)])
        await client.listener.on_partitions_revoked([aiokafka_consumer.TopicPartition("t", 0)])
        return calls

    assert asyncio.run(scenario()) == []


def test_a_cancelled_aiokafka_close_still_stops_the_client(monkeypatch: pytest.MonkeyPatch) -> None:
    async def scenario() -> bool:
        monkeypatch.setattr(aiokafka_consumer, "AIOKafkaConsumer", _FakeClient)
        consumer = AiokafkaGroupConsumer(KafkaSettings(bootstrap="127.0.0.1:9"), "g")
        await consumer.subscribe(["t"], lambda tps: None, lambda tps: {})
        client: Any = consumer._consumer
        closing = asyncio.ensure_future(consumer.close())
        await client.stopping.wait()
        closing.cancel()
        with pytest.raises(asyncio.CancelledError):
            await closing
        client.release.set()
        others = asyncio.all_tasks() - {asyncio.current_task()}
        await asyncio.gather(*others)  # the stop, going on (aiokafka would not stop twice)
        return bool(client.stopped)

    assert asyncio.run(scenario()) is True


def _rejoin_attempts(refusing: Refusing, attempts: int) -> None:
    """Poll at every due resume until ``attempts`` rejoins were tried (or one closed the client)."""
    for _ in range(SEEK_ATTEMPTS - 1 + attempts):
        if "CloseConsumer" in refusing.script.names():
            return
        refusing.now = refusing.loop.gate.next_due() or refusing.now
        refusing.poll()


def test_with_earliest_the_rejoin_goes_ahead_once_the_held_offsets_failed_to_commit_often(
    caplog: pytest.LogCaptureFixture,
) -> None:
    refusing = Refusing(offset_reset="earliest")
    refusing.hold()
    refusing.commit_fails = 1000  # the stuck client cannot commit either
    with caplog.at_level("WARNING", logger="outboxkit.inbox.consumer"):
        _rejoin_attempts(refusing, COMMIT_ATTEMPTS - 1)
        assert "CloseConsumer" not in refusing.script.names()
        _rejoin_attempts(refusing, 1)
    names = refusing.script.names()
    close = names.index("CloseConsumer")
    assert names[close - 1 : close + 2] == ["Commit", "CloseConsumer", "Subscribe"]
    assert _commits(refusing) == [{OTHER: 4, HELD: 5}] * COMMIT_ATTEMPTS
    assert any("rejoining the group all the same" in m for m in caplog.messages)
    # The new member starts at or before the held record (earliest): the hold goes over.
    assert refusing.loop.gate.held == frozenset({HELD})
    assert refusing.loop.assigned == {HELD, OTHER}


@pytest.mark.parametrize("policy", ["latest", "none", "error"])
def test_with_another_reset_policy_the_rejoin_waits_for_the_commit_and_says_why(
    policy: str, caplog: pytest.LogCaptureFixture
) -> None:
    refusing = Refusing(offset_reset=policy)
    refusing.hold()
    refusing.commit_fails = 1000
    with caplog.at_level("WARNING", logger="outboxkit.inbox.consumer"):
        _rejoin_attempts(refusing, COMMIT_ATTEMPTS + 2)
    assert "CloseConsumer" not in refusing.script.names()  # never past the held record
    assert len(_commits(refusing)) == COMMIT_ATTEMPTS + 2
    assert refusing.loop.gate.held == frozenset({HELD})
    assert any(
        f"with auto.offset.reset={policy} a partition without a committed offset would start"
        " the new member past the held record" in m
        for m in caplog.messages
    )
    refusing.commit_fails = 0  # the commit goes through at last: then the rejoin
    _rejoin_attempts(refusing, 1)
    assert refusing.script.names().count("CloseConsumer") == 1


def test_a_failed_commit_keeps_settled_offsets_only_of_partitions_still_assigned() -> None:
    refusing = Refusing()
    refusing.hold()  # 1/3 settled, not committed yet
    answer = refusing.answer

    def revoking(step: Step) -> Any:  # partition 1 goes while the commit waits, then it fails
        if isinstance(step, Commit) and OTHER in step.offsets:
            refusing.loop.on_revoke([OTHER])
            raise PublishError("offset commit failed: rebalance in progress")
        return answer(step)

    refusing.script = Script(revoking)
    _rejoin_attempts(refusing, 1)
    assert refusing.loop.assigned == {HELD}
    assert refusing.loop.pending is not None
    assert refusing.loop.pending.take() == {}  # not ours any more: never committed by us


@pytest.mark.parametrize(
    "error", [ConfigurationError("the Kafka consumer cannot be created"), TypeError("a bug")]
)
def test_a_new_client_that_cannot_subscribe_for_a_lasting_reason_ends_run(error: Exception) -> None:
    refusing = Refusing()
    refusing.hold()
    refusing.subscribe_fails, refusing.subscribe_error = 1, error
    with pytest.raises(type(error)):
        refusing.refuse_until_rejoined()
    assert "Sleep" not in refusing.script.names()


def test_a_sync_back_off_ends_once_the_stop_event_is_set(monkeypatch: pytest.MonkeyPatch) -> None:
    def not_watching(seconds: float) -> None:
        raise AssertionError("slept without watching the stop event")

    monkeypatch.setattr(kafka_steps_module.time, "sleep", not_watching)
    stop = threading.Event()
    steps = kafka_steps(cast(Any, object()), cast(Any, object()), lambda: stop)
    stop.set()
    steps[Sleep](Sleep(3600.0))  # returns at once: a stop does not wait out the back-off


@pytest.mark.parametrize(
    ("config", "policy"),
    [
        ({}, "earliest"),
        ({"auto.offset.reset": "smallest"}, "earliest"),
        ({"auto.offset.reset": "latest"}, "latest"),
    ],
)
def test_the_confluent_consumer_says_its_reset_policy(config: dict[str, Any], policy: str) -> None:
    pytest.importorskip("confluent_kafka")
    from outboxkit.kafka.confluent_consumer import ConfluentGroupConsumer

    consumer = ConfluentGroupConsumer(KafkaSettings(bootstrap="127.0.0.1:9"), "g", config=config)
    try:
        assert consumer.offset_reset == policy
    finally:
        consumer.close()


@pytest.mark.parametrize(
    ("config", "policy"), [({}, "earliest"), ({"auto_offset_reset": "latest"}, "latest")]
)
def test_the_aiokafka_consumer_says_its_reset_policy(config: dict[str, Any], policy: str) -> None:
    consumer = AiokafkaGroupConsumer(KafkaSettings(bootstrap="127.0.0.1:9"), "g", config=config)
    assert consumer.offset_reset == policy


def test_the_confluent_inbox_consumer_wires_its_reset_policy_and_stop_event(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The loop knows the client's policy; a back-off in run() ends once its stop is set."""
    pytest.importorskip("confluent_kafka")
    from outboxkit.inbox.confluent import ConfluentInboxConsumer

    engine = create_engine("postgresql+psycopg://u@127.0.0.1:1/db")  # never connected
    inbox = Inbox(
        engine, lambda e, c, s: None, InboxSettings(consumer="c", registry=EventRegistry())
    )
    consumer = ConfluentInboxConsumer(
        inbox,
        KafkaSettings(bootstrap="127.0.0.1:9"),
        group_id="g",
        topics=["t"],
        dead_letter=None,
        config={"auto.offset.reset": "latest"},
    )
    try:
        assert consumer.loop.options.offset_reset == "latest"

        def backing_off(stopped: Any, max_messages: int | None) -> Plan[int]:
            yield Sleep(3600.0)
            return 0

        def not_watching(seconds: float) -> None:
            raise AssertionError("slept without watching the stop event")

        monkeypatch.setattr(consumer.loop, "run", backing_off)
        monkeypatch.setattr(kafka_steps_module.time, "sleep", not_watching)
        stop = threading.Event()
        stop.set()
        assert consumer.run(stop) == 0
    finally:
        consumer.close()
        engine.dispose()
