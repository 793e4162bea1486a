"""What a refused record of a cut send leaves behind (``BatchPublisher._handle_failures``), and
that a configuration read that times out crosses the Kafka seam as ``PublishError``."""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Sequence
from typing import Any, ClassVar

import pytest

from outboxkit.errors import PublishError
from outboxkit.faults import FaultPoints
from outboxkit.kafka import aiokafka_producer, confluent_producer
from outboxkit.kafka.api import NOT_SENT, RecordError, TopicLimits, TransactionalProducer
from outboxkit.kafka.confluent_admin import ConfluentAdmin
from outboxkit.relay.metrics import RelayMetrics
from outboxkit.relay.publisher import BatchPublisher, Outcome
from outboxkit.relay.reader import OutboxRecord
from outboxkit.settings import KafkaSettings, RelaySettings

pytestmark = pytest.mark.unit

TOO_LARGE = RecordError("MSG_SIZE_TOO_LARGE", "Broker: Message size too large")
_TERM: Any = None  # the fake store takes any term
_CONN: Any = None


class _Store:
    """Writes down what is marked and parked."""

    def __init__(self) -> None:
        self.defects: dict[int, str] = {}
        self.marked: list[int] = []
        self.parked: list[int] = []

    async def mark_published(
        self, conn: object, term: object, ids: list[int], *, delete: bool
    ) -> int:
        self.marked.extend(ids)
        return len(ids)

    async def park(self, conn: object, term: object, row_id: int, reason: str) -> int:
        self.parked.append(row_id)
        return 1


class _Producer:
    def __init__(self, transactional: bool) -> None:
        self.transactional = transactional
        self.aborted = 0

    async def abort(self) -> None:
        self.aborted += 1


def _row(n: int) -> OutboxRecord:
    return OutboxRecord(n, f"e{n}", f"i{n}", "t", "k", b"x", "a", None, None, None, None, None, 0)


def _publisher(store: _Store) -> BatchPublisher:
    return BatchPublisher(
        RelaySettings(batch_size=10, max_batch_size=40),
        0,
        store=store,  # type: ignore[arg-type]
        checkpoints=None,
        metrics=RelayMetrics(),
        faults=FaultPoints(""),
    )


async def test_a_record_refused_in_a_send_of_its_own_is_parked_and_only_what_was_acked_marked() -> (
    None
):
    """At least once: rows 1-3 were carried by earlier claims, 4 and 5 acknowledged in earlier
    sends of this claim, 6 refused alone, 7 not produced."""
    store = _Store()
    publisher = _publisher(store)
    publisher._gate.limits.alone = 2  # row 6: the third request of the last send
    outcome = await publisher._handle_failures(
        _TERM,
        _CONN,
        _Producer(transactional=False),  # type: ignore[arg-type]
        [1, 2, 3, 4, 5, 6, 7],
        [(_row(6), TOO_LARGE), (_row(7), NOT_SENT.error)],  # type: ignore[list-item]
        2,
    )
    assert outcome is Outcome.RETRY_NOW
    assert store.marked == [1, 2, 3, 4, 5]
    assert store.parked == [6]


async def test_exactly_once_a_single_refused_row_is_parked_and_nothing_marked() -> None:
    store = _Store()
    publisher = _publisher(store)
    producer = _Producer(transactional=True)
    outcome = await publisher._handle_failures(
        _TERM,
        _CONN,
        producer,  # type: ignore[arg-type]
        [4],
        [(_row(4), TOO_LARGE)],
        1,
    )
    assert outcome is Outcome.RETRY_NOW
    assert (store.marked, store.parked, producer.aborted) == ([], [4], 1)


async def test_exactly_once_never_marks_rows_of_the_aborted_transaction() -> None:
    """Even with a record said to be refused alone (only at_least_once cuts sends)."""
    store = _Store()
    publisher = _publisher(store)
    publisher._gate.limits.alone = 0
    outcome = await publisher._handle_failures(
        _TERM,
        _CONN,
        _Producer(transactional=True),  # type: ignore[arg-type]
        [1, 2, 3, 4],
        [(_row(4), TOO_LARGE)],
        2,
    )
    assert outcome is Outcome.RETRY_NOW
    assert store.marked == []  # the transaction carrying rows 1-3 was aborted


class _Future:
    def result(self, timeout: float | None = None) -> object:
        raise concurrent.futures.TimeoutError()


class _Client:
    """An admin client whose DescribeConfigs answer is not there in time."""

    def describe_configs(self, resources: list[object], **kwargs: object) -> dict[object, object]:
        return {resource: _Future() for resource in resources}

    def poll(self, timeout: float) -> int:
        return 0


async def test_a_confluent_configuration_read_that_times_out_is_a_publish_error() -> None:
    """future.result(timeout=...) raised a bare TimeoutError, which ended the relay's term."""
    admin = ConfluentAdmin(KafkaSettings.plaintext("127.0.0.1:1"), timeout=0.1)
    admin._client = _Client()  # type: ignore[assignment]
    with pytest.raises(PublishError, match="configuration of topic 't': no answer within"):
        await admin.topic_config("t", "max.message.bytes")
    await admin.close()


class _Admin:
    """Answers configuration reads; its close raises what no client documents."""

    made: ClassVar[list[_Admin]] = []

    def __init__(self, settings: object, *, timeout: float) -> None:
        self.requests: list[tuple[str, ...]] = []
        self.closed = False
        _Admin.made.append(self)

    async def topic_configs(self, topic: str, names: Sequence[str]) -> dict[str, str | None]:
        self.requests.append(tuple(names))
        return {"max.message.bytes": "200000", "cleanup.policy": "compact"}

    async def close(self) -> None:
        self.closed = True
        raise RuntimeError("unexpected")


class _Inner:
    """The producer's own client: writes down that it was closed."""

    def __init__(self) -> None:
        self.closed = False

    def purge(self) -> None:
        self.closed = True

    def flush(self, timeout: float) -> int:
        return 0

    async def stop(self) -> None:
        self.closed = True


@pytest.mark.parametrize("client", ["confluent", "aiokafka"])
async def test_one_admin_serves_every_read_of_a_producer_life_and_its_close_closes_it(
    client: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An admin client was made and closed for each read (a connection setup per topic, ~30 s
    per topic with aiokafka on a stalled broker); its close must not stop the producer's."""
    settings = KafkaSettings.plaintext("127.0.0.1:1")
    producer: TransactionalProducer
    if client == "confluent":
        monkeypatch.setattr(confluent_producer, "ConfluentAdmin", _Admin)
        producer = confluent_producer.ConfluentTransactionalProducer(
            settings, transactional_id=None
        )
    else:
        monkeypatch.setattr(aiokafka_producer, "AiokafkaAdmin", _Admin)
        producer = aiokafka_producer.AiokafkaTransactionalProducer(settings, transactional_id=None)
    _Admin.made.clear()
    for topic in ("t", "u", "v"):
        assert await producer.topic_limits(topic) == TopicLimits(200_000, "compact")
    [admin] = _Admin.made
    assert admin.requests == [("max.message.bytes", "cleanup.policy")] * 3
    assert not admin.closed
    inner = _Inner()
    producer._producer = inner  # type: ignore[attr-defined]
    await producer.close()  # the admin's close raises: swallowed, the producer closed anyway
    assert admin.closed
    assert inner.closed


class _Destroyed:
    """An admin client that writes down on which thread it is served and freed."""

    def __init__(self, threads: list[str]) -> None:
        self._threads = threads

    def poll(self, timeout: float) -> int:
        self._threads.append(threading.current_thread().name)
        return 0


async def test_a_confluent_admin_is_closed_off_the_event_loop_thread() -> None:
    """Its last reference was dropped on the event loop: rd_kafka_destroy, which waits for the
    client's threads, blocked the loop."""
    threads: list[str] = []
    admin = ConfluentAdmin(KafkaSettings.plaintext("127.0.0.1:1"), timeout=0.1)
    admin._client = _Destroyed(threads)  # type: ignore[assignment]
    await admin.close()
    assert threads
    assert threading.current_thread().name not in threads
    assert admin._client is None
