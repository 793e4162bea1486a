"""What the consumer carries over when it replaces a client that keeps refusing seeks.

The new member starts every partition at its committed offset: the held offsets are committed
before the old client goes (none committed yet would mean ``auto.offset.reset``), and this
member's holds and failure counts go over to the new client's first assignment.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from outboxkit.inbox import Envelope, OutcomeKind
from outboxkit.inbox.gate import SEEK_ATTEMPTS
from outboxkit.inbox.outcome import Outcome
from outboxkit.inbox.steps import (
    Commit,
    Pause,
    Plan,
    Resume,
    Seek,
    Sql,
    Step,
)
from outboxkit.kafka import aiokafka_consumer
from outboxkit.kafka.aiokafka_consumer import AiokafkaGroupConsumer
from outboxkit.settings import KafkaSettings
from tests.unit.test_inbox_core import _record
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
