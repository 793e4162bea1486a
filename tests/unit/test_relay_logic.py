"""Pure logic of the relay: fault specs, error kinds, back-off, lease trust, records.

(Settings are tested in ``test_settings.py``.)"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
import uuid

import pytest

from outboxkit.errors import LeaseLostError, PublishError
from outboxkit.faults import FaultPoints, parse_fault
from outboxkit.kafka.api import ProduceRequest, RecordError, transactional_id
from outboxkit.kafka.errors import ErrorKind, classify
from outboxkit.relay import lease as lease_module
from outboxkit.relay.checkpoint import Checkpoint, checkpoint_key
from outboxkit.relay.lease import LeaseStore, LeaseTerm, trust_margin
from outboxkit.relay.lease_loss import LeaseLoss
from outboxkit.relay.metrics import RelayMetrics
from outboxkit.relay.publisher import BatchPublisher
from outboxkit.relay.reader import OutboxRecord, ShardStore, produce_requests
from outboxkit.relay.runner import slot_transactional_id
from outboxkit.relay.waiting import backoff_delay
from outboxkit.settings import RelaySettings

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("spec", "point", "nth", "stop"),
    [
        ("after_claim", "after_claim", 1, False),
        ("after_produce:3", "after_produce", 3, False),
        ("after_kafka_commit:2:stop", "after_kafka_commit", 2, True),
    ],
)
def test_fault_specs(spec: str, point: str, nth: int, stop: bool) -> None:
    parsed = parse_fault(spec)
    assert parsed is not None
    assert (parsed.point, parsed.nth, parsed.stop) == (point, nth, stop)


def test_unknown_fault_point_is_refused_and_empty_means_off() -> None:
    assert parse_fault("") is None
    assert parse_fault(None) is None
    with pytest.raises(ValueError, match="unknown fault point"):
        parse_fault("before_everything")


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("MSG_SIZE_TOO_LARGE", ErrorKind.PERMANENT),
        ("UNKNOWN_TOPIC_OR_PART", ErrorKind.PERMANENT),
        ("TOPIC_AUTHORIZATION_FAILED", ErrorKind.PERMANENT),
        ("INVALID_TOPIC_EXCEPTION", ErrorKind.PERMANENT),
        ("MessageSizeTooLargeError", ErrorKind.PERMANENT),
        ("UnknownTopicOrPartitionError", ErrorKind.PERMANENT),
        ("INVALID_RECORD", ErrorKind.PERMANENT),
        ("InvalidRecordError", ErrorKind.PERMANENT),
        ("UnknownError", ErrorKind.RETRIABLE),  # aiokafka: UNKNOWN_SERVER_ERROR, unnamed codes
        ("_FENCED", ErrorKind.FENCED),
        ("ProducerFenced", ErrorKind.FENCED),
        ("INVALID_PRODUCER_EPOCH", ErrorKind.FENCED),
        ("_MSG_TIMED_OUT", ErrorKind.RETRIABLE),
        ("NOT_ENOUGH_REPLICAS", ErrorKind.RETRIABLE),
        ("KafkaConnectionError", ErrorKind.RETRIABLE),
    ],
)
def test_error_classification(name: str, kind: ErrorKind) -> None:
    assert classify(name) is kind
    assert RecordError(name, "m").kind is kind


def test_an_unnamed_aiokafka_refusal_is_permanent_only_for_a_batch_with_a_keyless_record() -> None:
    """aiokafka reports INVALID_RECORD (a compacted topic refusing a record without a key) and
    UNKNOWN_SERVER_ERROR alike, as a bare UnknownError: only the first is a record to park."""
    from aiokafka.errors import UnknownError

    from outboxkit.kafka.aiokafka_producer import _delivery_error

    assert _delivery_error(UnknownError(), keyless=True).kind is ErrorKind.PERMANENT
    assert "without a key" in str(_delivery_error(UnknownError(), keyless=True))
    assert _delivery_error(UnknownError(), keyless=False).kind is ErrorKind.RETRIABLE


def test_backoff_is_bounded_jittered_and_grows() -> None:
    rng = random.Random(7)
    delays = [backoff_delay(n, 0.2, 5.0, rng) for n in range(1, 12)]
    assert all(0.1 <= d <= 5.0 for d in delays)
    assert max(delays[-3:]) > max(delays[:2])
    assert 2.5 <= backoff_delay(50, 0.2, 5.0, rng) <= 5.0


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("ttl", [1.0, 3.0, 15.0, 60.0])
def test_trust_window_ends_before_the_lease_can_expire(ttl: float) -> None:
    clock, wall = FakeClock(), FakeClock()
    term = LeaseTerm("g", 0, "me", 5, ttl, 0.0, clock, wall=wall)
    term.extend(clock.now, wall.now)
    assert 0 < trust_margin(ttl) < ttl
    clock.now += ttl - trust_margin(ttl) - 0.001
    wall.now += ttl - trust_margin(ttl) - 0.001
    term.check()
    assert term.held
    clock.now += 0.002  # still before the database expiry (sent_at + ttl), but no longer trusted
    wall.now += 0.002
    assert not term.held
    with pytest.raises(LeaseLostError) as lost:
        term.check()
    assert lost.value.context["cause"] is LeaseLoss.TRUST_LAPSED


def test_lost_is_sticky_even_if_a_late_renewal_lands() -> None:
    clock, wall = FakeClock(), FakeClock()
    term = LeaseTerm("g", 1, "me", 9, 3.0, 0.0, clock, wall=wall)
    term.extend(clock.now, wall.now)
    term.mark_lost("renewal matched no row", LeaseLoss.TAKEN_OVER)
    term.mark_lost("a later reason", LeaseLoss.FENCED)  # the first one stays
    term.extend(clock.now, wall.now)
    with pytest.raises(LeaseLostError, match="renewal matched no row") as lost:
        term.check()
    assert lost.value.context["cause"] is LeaseLoss.TAKEN_OVER


def test_a_paused_host_stops_trusting_at_once_on_resume() -> None:
    """A paused VM: its monotonic clock stood still, its wall clock is set forward on resume,
    while the database's clock ran on. The jump counts against the trust window."""
    clock, wall = FakeClock(), FakeClock()
    wall.now = 1_000_000.0
    term = LeaseTerm("g", 0, "me", 5, 15.0, 0.0, clock, wall=wall)
    term.extend(clock.now, wall.now)
    clock.now += 1.0
    wall.now += 1.0
    assert term.held
    wall.now += 20.0  # resumed after 20 s; the monotonic clock did not move
    assert term.jumped() == pytest.approx(20.0)
    assert not term.held
    with pytest.raises(LeaseLostError, match=r"wall clock jumped 20\.0s ahead .* was paused, or"):
        term.check()
    assert term.lost_cause is LeaseLoss.CLOCK_JUMP


def test_a_pause_between_a_renewal_and_its_reply_counts_too() -> None:
    clock, wall = FakeClock(), FakeClock()
    term = LeaseTerm("g", 0, "me", 5, 15.0, 0.0, clock, wall=wall)
    sent_at, sent_wall = clock.now, wall.now
    wall.now += 30.0  # paused after the database renewed, before the reply was read
    term.extend(sent_at, sent_wall)
    assert not term.held


@pytest.mark.parametrize("renewal", [False, True])
async def test_the_store_reads_the_wall_clock_before_the_statement_goes_out(
    monkeypatch: pytest.MonkeyPatch, renewal: bool
) -> None:
    """A pause while the acquire or renewal is in flight must count against the term."""
    clock, wall = FakeClock(), FakeClock()

    async def paused_during_the_statement(*_: object) -> list[tuple[int, None]]:
        wall.now += 30.0  # the VM paused after the database answered, before we read it
        return [(0, None)]  # (token, previous) for an acquisition; a renewal reads the first

    async def first(*args: object) -> tuple[int, None]:
        return (await paused_during_the_statement(*args))[0]

    store = LeaseStore("outboxkit", clock=clock, wall=wall)
    if renewal:
        term = LeaseTerm("g", 0, "me", 5, 15.0, 0.0, clock, wall=wall)
        term.extend(clock.now, wall.now)
        monkeypatch.setattr(lease_module.db, "rows_async", paused_during_the_statement)
        assert await store.renew_many(None, [term]) == []  # type: ignore[arg-type]
    else:
        monkeypatch.setattr(lease_module.db, "one_async", first)
        got = await store.acquire(None, "g", 0, "me", 15.0)  # type: ignore[arg-type]
        assert got is not None
        term = got
    assert term.jumped() == pytest.approx(30.0)
    assert not term.held


def test_small_or_backward_wall_steps_change_nothing() -> None:
    clock, wall = FakeClock(), FakeClock()
    term = LeaseTerm("g", 0, "me", 5, 15.0, 0.0, clock, wall=wall)
    term.extend(clock.now, wall.now)
    wall.now -= 3600.0  # stepped back: the monotonic deadline still decides
    clock.now += 10.0
    assert term.held
    assert term.remaining() == pytest.approx(15.0 - trust_margin(15.0) - 10.0)
    wall.now += 3600.0 + 10.0 + 0.05  # NTP-sized drift on top
    assert term.held
    term.check()


def test_checkpoint_round_trip_and_key() -> None:
    rows = ((1, str(uuid.uuid4())), (5, str(uuid.uuid4())))
    checkpoint = Checkpoint("g", 3, 42, rows)
    assert Checkpoint.decode("g", 3, checkpoint.encode()) == checkpoint
    # Event ids are read back checked and in the claim's canonical text form.
    event_id = uuid.uuid4()
    upper = b'{"token": 1, "ids": [2], "event_ids": ["%s"]}' % str(event_id).upper().encode()
    assert Checkpoint.decode("g", 3, upper).rows == ((2, str(event_id)),)
    for hostile in (
        b'{"token": 1, "ids": [2], "event_ids": ["not-a-uuid"]}',
        b'{"token": 1, "ids": [2, 3], "event_ids": ["%s"]}' % str(event_id).encode(),
        b'{"token": 1, "ids": [2]}',
        b'{"token": null, "ids": [], "event_ids": []}',
        b"[1, 2]",
        b"\xff not json",
        b'{"token": 1e999, "ids": [], "event_ids": []}',
        b'{"token": 1, "ids": [Infinity], "event_ids": ["%s"]}' % str(event_id).encode(),
        b'{"token": 1.5, "ids": [], "event_ids": []}',
        b'{"token": "1", "ids": [], "event_ids": []}',
        b'{"token": true, "ids": [], "event_ids": []}',
        b"[" * 200_000 + b"]" * 200_000,
    ):
        with pytest.raises(PublishError, match="key 'g/3' is unreadable"):
            Checkpoint.decode("g", 3, hostile)
    assert checkpoint_key("g", 3) == b"g/3"
    assert transactional_id("g", 3) == "outboxkit-relay.g.3"
    assert transactional_id("g", 3) != transactional_id("g", 4)


def test_producer_slots_have_their_own_ids_and_keys_and_slot_zero_keeps_the_old_ones() -> None:
    rows = ((7, str(uuid.uuid4())),)
    checkpoint = Checkpoint("g", 3, 42, rows, slot=1, seq=9)
    assert Checkpoint.decode("g", 3, checkpoint.encode(), slot=1) == checkpoint
    assert checkpoint_key("g", 3, 0) == b"g/3"
    assert checkpoint_key("g", 3, 1) == b"g/3/1"
    assert slot_transactional_id("g", 3, 0) == transactional_id("g", 3)
    assert slot_transactional_id("g", 3, 1) == "outboxkit-relay.g.3.1"
    assert slot_transactional_id("g", 3, 1) != slot_transactional_id("g", 31, 0)
    # A checkpoint written before slots existed decodes as slot 0, sequence 0.
    old = b'{"token": 5, "ids": [1], "event_ids": ["%s"]}' % rows[0][1].encode()
    assert Checkpoint.decode("g", 3, old) == Checkpoint("g", 3, 5, ((1, rows[0][1]),))


def test_record_headers_carry_identity_and_trace_context() -> None:
    event_id = str(uuid.uuid4())
    record = OutboxRecord(
        id=1,
        event_id=event_id,
        idempotency_key="idem-1",
        topic="t",
        key="k",
        payload=b"{}",
        content_type="application/json",
        headers={"traceparent": "00-a-b-01", "event-id": "spoofed"},
        event_type="order.placed",
        schema_version=2,
        aggregate_type=None,
        aggregate_id=None,
        attempts=0,
    )
    headers = dict(record.kafka_headers())
    assert headers["event-id"] == event_id.encode()  # the row's identity wins
    assert headers["idempotency-key"] == b"idem-1"
    assert headers["event-type"] == b"order.placed"
    assert headers["schema-version"] == b"2"
    assert headers["traceparent"] == b"00-a-b-01"
    assert "aggregate-id" not in headers


class _BrokenError:
    """A delivery error whose first call fails, as when confluent-kafka left the fatal
    ``_FENCED`` exception pending before calling the delivery callback."""

    def name(self) -> str:
        from confluent_kafka import KafkaError, KafkaException

        try:
            raise KafkaException(KafkaError(KafkaError._FENCED, "fenced by a newer producer"))
        except KafkaException as pending:
            raise SystemError("<method 'name'> returned a result with an exception set") from (
                pending
            )

    def str(self) -> str:
        return "unused"


def test_delivery_callback_never_raises_and_a_fenced_record_means_fenced() -> None:
    pytest.importorskip("confluent_kafka")
    from outboxkit.errors import ProducerFencedError
    from outboxkit.kafka.api import Delivery
    from outboxkit.kafka.confluent_producer import _raise_if_fenced, _report

    results: list[Delivery | None] = [None, None]
    _report(results, 0, _BrokenError(), None)  # must not raise into librdkafka
    first = results[0]
    assert first is not None
    assert first.error is not None
    assert first.error.name == "_FENCED"
    assert first.error.kind is ErrorKind.FENCED
    with pytest.raises(ProducerFencedError):
        _raise_if_fenced(results)
    _raise_if_fenced([Delivery(error=RecordError("MSG_SIZE_TOO_LARGE", "x")), None])


def _rows(count: int, size: int = 10) -> list[OutboxRecord]:
    return [
        OutboxRecord(
            n, str(uuid.uuid4()), f"i{n}", "t", "k", b"x" * size, "a", None, *[None] * 4, 0
        )
        for n in range(count)
    ]


def _publisher(config: RelaySettings) -> BatchPublisher:
    return BatchPublisher(
        config,
        0,
        store=ShardStore("outboxkit"),
        checkpoints=None,
        metrics=RelayMetrics(),
        faults=FaultPoints(""),
    )


@pytest.mark.parametrize(
    ("claim", "rows", "settings", "continues"),
    [
        (_rows(10), 10, {}, True),  # a full claim under backlog: the transaction takes another
        (_rows(9), 9, {}, False),  # a short claim: drained, commit at once (an idle relay)
        (_rows(10), 50, {"transaction_max_rows": 59}, False),  # another claim would pass it
        (_rows(10), 50, {"transaction_max_rows": 60}, True),
        (_rows(10), 10, {"transaction_max_ms": 0}, False),  # one claim per transaction
        (_rows(2, 600), 2, {"max_batch_bytes": 1024}, True),  # cut by the byte cap: backlog
    ],
)
def test_transaction_boundaries_follow_backlog_rows_and_time(
    claim: list[OutboxRecord], rows: int, settings: dict[str, int], continues: bool
) -> None:
    config = RelaySettings(batch_size=10, max_batch_size=10, **settings)  # type: ignore[arg-type]
    publisher = _publisher(config)
    publisher._sizer.observe(10, len(claim), sum(len(r.payload) for r in claim))
    now = time.monotonic()
    assert (publisher._next_limit(rows, now) > 0) is continues
    # However full the claim, a transaction open longer than transaction_max_ms commits.
    assert publisher._next_limit(rows, now - config.transaction_max_ms / 1000 - 1) == 0


class _FullClaims:
    """A store whose every claim comes back full (a backlog)."""

    claimed_bytes = 0  # full by rows, not by bytes

    async def claim(self, conn: object, shard: int, limit: int, in_flight: object) -> list[object]:
        return list(_rows(limit))


class _NotTransactional:
    transactional = False


def test_a_permanent_error_in_one_grown_claim_is_isolated_in_claims_of_batch_size() -> None:
    """A lone claim of 39 rows (grown past batch_size 10) with a bad record: the retry goes in
    one-claim transactions of 10, and the claims do not grow back meanwhile, so at most 10 rows
    are ever isolated one by one."""
    config = RelaySettings(batch_size=10, max_batch_size=40)
    publisher = _publisher(config)
    publisher._store = _FullClaims()  # type: ignore[assignment]
    bad = _rows(1)[0]
    error = RecordError("MSG_SIZE_TOO_LARGE", "record too large")
    assert error.kind is ErrorKind.PERMANENT
    failures = publisher._handle_failures(
        None,  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        _NotTransactional(),  # type: ignore[arg-type]
        list(range(39)),
        [(bad, error)],
        1,
    )
    asyncio.run(failures)
    assert publisher._isolate_remaining == 0
    limits = []
    for _ in range(4):
        limits.append(publisher.limit)
        asyncio.run(publisher.claim(None))  # type: ignore[arg-type]
        publisher._one_claim_transactions -= 1  # as each one-claim transaction commits
    assert limits == [10, 10, 10, 10]
    assert publisher.limit == 10  # grows again only from here, under the backlog


def test_produce_requests_have_the_same_headers_for_every_shape_of_row() -> None:
    """The usual row takes an inline fast path; every shape must give the record kafka_headers
    gives (same names, bytes, order), and the plain row exactly its three headers."""
    plain = OutboxRecord(
        1, str(uuid.uuid4()), "idem", "t", None, b"{}", "application/json", *[None] * 5, 0
    )
    assert produce_requests([plain]) == [
        ProduceRequest(
            "t",
            None,
            b"{}",
            [
                ("event-id", plain.event_id.encode()),
                ("idempotency-key", b"idem"),
                ("content-type", b"application/json"),
            ],
        )
    ]
    shapes = itertools.product(
        [None, {}, {"traceparent": "00-a-b-01", "event-id": "spoofed"}],
        [None, "order.placed"],
        [None, 2],
        [None, "order"],
        [None, "o-1"],
        [None, "k"],
    )
    records = [
        plain._replace(
            id=n, key=key, headers=own, event_type=kind, schema_version=version,
            aggregate_type=agg_type, aggregate_id=agg_id,
        )
        for n, (own, kind, version, agg_type, agg_id, key) in enumerate(shapes)
    ]  # fmt: skip
    built = produce_requests(records)
    assert [type(r) for r in built] == [ProduceRequest] * len(records)
    assert built == [
        ProduceRequest(r.topic, r.key.encode() if r.key else None, r.payload, r.kafka_headers())
        for r in records
    ]


class _Timeline:
    """A store, a topic gate and a producer that write down, in order, what the publisher did:
    when its claims ran against its Kafka send and commit."""

    def __init__(self, transactional: bool, claimed: int, fails: str | None = None) -> None:
        self.transactional, self.claimed, self.fails = transactional, claimed, fails
        self.events: list[str] = []
        self.claimed_bytes = 0  # full by rows, not by bytes

    async def claim(self, conn: object, shard: int, limit: int, in_flight: object) -> list[object]:
        self.events.append("claim")
        await asyncio.sleep(0)
        if self.fails == "claim":
            raise PublishError("the claim failed")
        return list(_rows(self.claimed))

    async def mark_published(self, conn: object, term: object, ids: list[int], delete: bool) -> int:
        self.events.append("mark")
        return len(ids)  # every row was pending: each one marked

    async def sendable(
        self, term: object, conn: object, producer: object, claim: list[object]
    ) -> list[object]:
        return claim

    async def begin(self) -> None:
        self.events.append("begin")

    async def _step(self, name: str) -> None:
        self.events.append(f"{name} starts")
        for _ in range(5):  # the client's thread works; the loop runs other tasks meanwhile
            await asyncio.sleep(0)
        self.events.append(f"{name} returns")

    async def send(self, requests: list[object]) -> list[object]:
        await self._step("send")
        return [type("Delivered", (), {"error": None})() for _ in requests]

    async def commit(self) -> None:
        await self._step("commit")
        if self.fails == "commit":
            raise PublishError("the commit failed")


class _Term:
    token = 1

    def check(self) -> None:
        return None


@pytest.mark.parametrize(
    ("transactional", "claimed", "settings", "overlaps"),
    [
        # Exactly-once, no backlog (a short claim): the next transaction's first claim waits
        # for the deliveries and runs during the commit, so it sees rows written meanwhile.
        (True, 3, {}, "commit"),
        # Under backlog (a full claim; one claim per transaction) it overlaps the send.
        (True, 10, {"transaction_max_ms": 0}, "send"),
        # At-least-once has no commit to overlap: the claim overlaps the send.
        (False, 3, {}, "send"),
    ],
)
def test_the_next_claim_overlaps_the_send_under_backlog_and_the_commit_when_idle(
    transactional: bool, claimed: int, settings: dict[str, int], overlaps: str
) -> None:
    config = RelaySettings(batch_size=10, max_batch_size=10, **settings)  # type: ignore[arg-type]
    publisher = _publisher(config)
    timeline = _Timeline(transactional, claimed)
    publisher._store = timeline  # type: ignore[assignment]
    publisher._gate = timeline  # type: ignore[assignment]
    first = _rows(claimed)
    publisher._sizer.observe(10, len(first), sum(len(r.payload) for r in first))

    async def one_transaction() -> list[object]:
        _, following = await publisher.publish(_Term(), None, timeline, first)  # type: ignore[arg-type]
        await publisher.settle_mark()
        return following  # type: ignore[return-value]

    following = asyncio.run(one_transaction())
    events = timeline.events
    assert len(following) == claimed  # the next transaction's first claim, handed back
    assert events.count("claim") == 1
    claim = events.index("claim")
    if overlaps == "commit":  # after every delivery, on the wire before the commit
        assert events.index("send returns") < claim < events.index("commit starts")
    else:  # on the wire before the send
        assert claim < events.index("send starts")
    assert events[-1] == "mark"


@pytest.mark.parametrize("fails", ["commit", "claim"])
def test_a_failure_around_a_deferred_claim_surfaces_and_leaves_no_task_behind(fails: str) -> None:
    """The deferred claim runs during the commit. A failed commit waits for it before raising
    (the connection is free again, its outcome retrieved); a claim failing after the commit
    raises too, with the committed transaction already counted (its checkpoint is what the
    next producer life reconciles)."""
    publisher = _publisher(RelaySettings(batch_size=10, max_batch_size=10))
    timeline = _Timeline(True, 3, fails)
    publisher._store = timeline  # type: ignore[assignment]
    publisher._gate = timeline  # type: ignore[assignment]
    first = _rows(3)
    publisher._sizer.observe(10, len(first), sum(len(r.payload) for r in first))
    unretrieved: list[object] = []

    async def one_transaction() -> None:
        asyncio.get_running_loop().set_exception_handler(
            lambda _, context: unretrieved.append(context)
        )
        with pytest.raises(PublishError, match=f"the {fails} failed"):
            await publisher.publish(_Term(), None, timeline, first)  # type: ignore[arg-type]
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        assert tasks == []  # nothing left running on the shard's connection

    asyncio.run(one_transaction())
    assert unretrieved == []
    assert "claim" in timeline.events
    assert "mark" not in timeline.events  # no mark after a failure: reconciled instead
    assert publisher.stats.transactions == (1 if fails == "claim" else 0)


def test_the_back_off_survives_hours_of_failures() -> None:
    """A loop retrying every 30 s for 9 hours counts 1,080 failures: the delay stays capped."""
    rng = random.Random(1)
    assert all(15.0 <= backoff_delay(n, 1.0, 30.0, rng) <= 30.0 for n in (1025, 5000, 10**6))
