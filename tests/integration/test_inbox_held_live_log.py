"""What the inbox takes for a replaced log must never show on a live one, on the real clients.

A hold whose log was replaced (its topic deleted and created again) ends its event's row
``dead`` with no dead letter, so a sign seen on a live, unchanged log would lose that event
silently. Each premise is checked here over both clients, through the seam the inbox uses:

* the log's end read before the seek back (``log_bounds``) is past every offset delivered,
  whatever the timeout given, an open transaction after the record included (read_committed:
  the end is the last stable offset);
* the same record read twice (again after a seek back, through its compressed batch, with the
  broker's log-append time, headers with no value, an empty key) gives the same ``record_mark``;
* after a seek the partition delivers nothing below the seek's target, records below it fetched
  before included (what the gate would take, were it a sign, for a log starting again).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from confluent_kafka import Producer

from outboxkit.errors import PublishError
from outboxkit.inbox.gate import record_mark
from tests.integration.inbox_support import GroupMember, poll_members, produce

pytestmark = pytest.mark.integration

TopicFactory = Callable[..., str]


@pytest.fixture(params=["confluent", "aiokafka"])
def member(
    request: pytest.FixtureRequest, outboxkit_kafka_bootstrap: str
) -> Iterator[Callable[[], GroupMember]]:
    made: list[GroupMember] = []

    def make() -> GroupMember:
        group = f"g-{uuid.uuid4().hex[:8]}"
        made.append(GroupMember(str(request.param), outboxkit_kafka_bootstrap, group))
        return made[-1]

    yield make
    for each in made:
        each.close()


def _messages(count: int, start: int = 0) -> list[tuple[bytes | None, bytes, list[Any]]]:
    return [
        (None if n % 3 == 0 else b"" if n % 3 == 1 else f"k{n}".encode(), f"v{n}".encode(),
         [("h", f"{n}".encode()), ("empty", None), ("h", b"")])
        for n in range(start, start + count)
    ]  # fmt: skip


def _mark(record: Any) -> bytes:
    return record_mark(record.timestamp_ms, record.key, record.value, record.headers)


def _read_all(one: GroupMember, tp: tuple[str, int], count: int) -> dict[int, bytes]:
    """Every record of ``tp`` from offset 0, by offset: its mark."""
    records = poll_members([one], lambda got: len({r.offset for r in got}) >= count)
    return {r.offset: _mark(r) for r in records if (r.topic, r.partition) == tp}


def test_a_live_logs_end_is_past_every_offset_delivered(
    member: Callable[[], GroupMember],
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
) -> None:
    topic = outboxkit_topic()
    tp = (topic, 0)
    produce(outboxkit_kafka_bootstrap, topic, _messages(5))
    one = member()
    one.subscribe([topic])
    delivered = max(_read_all(one, tp, 5))
    assert one.call("log_bounds", tp, 5.0) == (0, 5)
    # An open transaction after the held record: the end read is the last stable offset.
    producer = Producer(
        {"bootstrap.servers": outboxkit_kafka_bootstrap, "transactional.id": uuid.uuid4().hex}
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic, b"open", partition=0)
    producer.flush(30)
    try:
        start, end = one.call("log_bounds", tp, 5.0)
        assert (start, end > delivered) == (0, True)
        for timeout in (0.001, 0.01, 0.1):  # cut short: not read, or read whole
            try:
                start, end = one.call("log_bounds", tp, timeout)
            except PublishError:
                continue
            assert (start, end > delivered) == (0, True), (timeout, start, end)
    finally:
        producer.abort_transaction(30)


@pytest.mark.parametrize(
    "config",
    [{}, {"message.timestamp.type": "LogAppendTime"}, {"compression.type": "gzip"}],
    ids=["create-time", "log-append-time", "compressed"],
)
def test_the_same_record_read_again_after_a_seek_back_has_the_same_mark(
    member: Callable[[], GroupMember],
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
    config: dict[str, str],
) -> None:
    topic = outboxkit_topic(config=config)
    tp = (topic, 0)
    produce(outboxkit_kafka_bootstrap, topic, _messages(30))
    one = member()
    one.subscribe([topic])
    first = _read_all(one, tp, 30)
    for held in (0, 7, 29):
        one.call("pause", [tp])
        assert one.call("seek", tp, held) is True
        one.call("resume", [tp])
        again = _read_all(one, tp, 30 - held)
        assert min(again) == held
        assert {o: first[o] for o in again} == again


def test_a_seek_delivers_nothing_below_its_target(
    member: Callable[[], GroupMember],
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
) -> None:
    """Records below the target were fetched (the client's queue, aiokafka's buffer) when the
    seek came: none of them is delivered after it."""
    topic = outboxkit_topic()
    tp = (topic, 0)
    produce(outboxkit_kafka_bootstrap, topic, _messages(400))
    one = member()
    one.subscribe([topic])
    poll_members([one], lambda got: got)
    for target in (300, 150, 390, 5):
        assert one.call("seek", tp, 0) is True  # fetched again from the start...
        below = poll_members([one], lambda got: got)  # ... some of it handed over
        assert min(r.offset for r in below) == 0
        one.call("pause", [tp])
        assert one.call("seek", tp, target) is True
        one.call("resume", [tp])
        want = 400 - target
        after = poll_members([one], lambda got, want=want: len(got) >= want)
        offsets = [r.offset for r in after if (r.topic, r.partition) == tp]
        assert offsets[0] == target, (target, offsets[:5])
        assert min(offsets) == target
