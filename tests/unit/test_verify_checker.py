"""The verify checker can fail: each anomaly kind, planted alone in a recorded history, is flagged.

Histories are built by hand (a small clean run plus one planted fault) and generated (hypothesis:
a random clean run always passes; planting any one anomaly always flags exactly that kind).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import zlib
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from outboxkit.verify import (
    AnomalyKind,
    ConsumerEffect,
    ConsumerSpec,
    Fault,
    History,
    HistoryFormatError,
    InboxState,
    InboxTokenObservation,
    KafkaRecord,
    RelayTokenObservation,
    RunParams,
    TopicSpec,
    WriteOp,
    WriteOutcome,
    check,
)

pytestmark = pytest.mark.unit

T = TypeVar("T")
TOPICS = ("orders", "payments")
PARTITIONS = 3
CONSUMERS = (
    ConsumerSpec("billing", ("orders",), clients=("confluent",)),
    ConsumerSpec("shipping", ("orders", "payments"), clients=("aiokafka",), processes=2),
)
W = WriteOutcome


def _digest(content: str) -> str:
    return hashlib.sha256(content.encode()).hexdigest()


class Builder:
    """Records a history the way a correct run would, so tests can then plant one fault."""

    def __init__(self, seed: int = 7) -> None:
        params = RunParams(
            seed=seed,
            mode="exactly_once",
            duration_s=60.0,
            writers=2,
            relays=2,
            relay_group="g",
            shards=2,
            topics=tuple(TopicSpec(t, PARTITIONS) for t in TOPICS),
            consumers=CONSUMERS,
            options={"hold_open": 0.5, "rebalance": True, "note": "x"},
        )
        self.h = History(params=params)
        self.n = 0
        self.seq: Counter[tuple[str, str]] = Counter()
        self.offsets: Counter[tuple[str, int]] = Counter()
        self.token = 0

    def _next(self) -> str:
        self.n += 1
        return f"ev-{self.n:04d}"

    def write(
        self,
        key: str | None,
        *,
        topic: str = "orders",
        outcome: WriteOutcome = W.COMMITTED,
        digest: str | None = None,
        ikey: str | None = None,
        existing: str | None = None,
        publish: bool | None = None,
        settle: str | None = "succeeded",
    ) -> WriteOp:
        event_id = self._next()
        live = outcome in (W.COMMITTED, W.UNKNOWN)
        publish = live if publish is None else publish
        seq = None
        if key is not None and live:
            seq = self.seq[(topic, key)] + 1
            if outcome is W.COMMITTED or publish:  # an unknown that did not commit frees its seq
                self.seq[(topic, key)] = seq
        op = WriteOp(
            writer=f"w{self.n % 2}",
            event_id=event_id,
            idempotency_key=ikey or f"ik-{event_id}",
            topic=topic,
            key=key,
            digest=digest or _digest(event_id),
            outcome=outcome,
            seq=seq,
            existing_event_id=existing,
            time=self.n / 10,
        )
        self.h.writes.append(op)
        if publish:
            self.publish(op)
            if settle:
                self.settle(op, settle)
        return op

    def partition(self, op: WriteOp) -> int:
        return zlib.crc32(op.key.encode()) % PARTITIONS if op.key else self.n % PARTITIONS

    def publish(self, op: WriteOp, partition: int | None = None, event_id: str | None = "") -> None:
        part = self.partition(op) if partition is None else partition
        offset = self.offsets[(op.topic, part)]
        self.offsets[(op.topic, part)] += 1
        eid = op.event_id if event_id == "" else event_id
        self.h.kafka.append(KafkaRecord(op.topic, part, offset, op.key, eid, op.seq))

    def settle(self, op: WriteOp, state: str) -> None:
        for spec in CONSUMERS:
            if op.topic in spec.topics:
                self.token += 1
                self.h.inbox_tokens.append(
                    InboxTokenObservation(spec.name, op.event_id, self.token)
                )
                self.h.inbox.append(InboxState(spec.name, op.event_id, state))
                if state == "succeeded":
                    self.h.effects.append(ConsumerEffect(spec.name, op.event_id, 1))

    def duplicate_of(self, op: WriteOp, digest: str | None = None) -> None:
        self.write(
            op.key,
            topic=op.topic,
            outcome=W.DUPLICATE,
            ikey=op.idempotency_key,
            digest=digest or op.digest,
            existing=op.event_id,
        )

    def reject_of(self, op: WriteOp, digest: str | None = None) -> None:
        other = digest or _digest("other " + op.event_id)
        self.write(
            op.key, topic=op.topic, outcome=W.REJECTED, ikey=op.idempotency_key, digest=other
        )

    def lease(self, shard: int, *, takeover: bool) -> None:
        mine = [o.token for o in self.h.relay_tokens if o.shard == shard]
        if takeover or not mine:
            self.token += 1
        token = self.token if takeover or not mine else mine[-1]
        self.h.relay_tokens.append(RelayTokenObservation("g", shard, token, self.n / 10, "r0"))

    def fault(self, kind: str, target: str) -> None:
        self.h.faults.append(Fault(kind, target, self.n / 10, "planted"))

    def committed(self, *, keyed: bool = False) -> list[WriteOp]:
        published = {r.event_id for r in self.h.kafka}
        return [
            op
            for op in self.h.writes
            if op.outcome is W.COMMITTED
            and op.event_id in published
            and (op.key is not None or not keyed)
        ]

    def succeeded(self) -> list[InboxState]:
        return [s for s in self.h.inbox if s.state == "succeeded"]


def clean() -> Builder:
    """A small correct run touching every part of the record."""
    b = Builder()
    b.lease(0, takeover=True)
    b.lease(1, takeover=True)
    a1 = b.write("k1")
    a2 = b.write("k2")
    b.write("k1")
    b.write("k1", outcome=W.ROLLED_BACK)
    b.duplicate_of(a2)
    b.reject_of(a1)
    b.write("p1", topic="payments")
    b.write("k3", settle="dead")
    b.write("k1", outcome=W.UNKNOWN, publish=True)
    b.write("k2", outcome=W.UNKNOWN, publish=False)
    b.write("k2")  # takes the sequence number the unknown write did not keep
    b.write(None)
    b.lease(0, takeover=False)
    b.lease(0, takeover=True)
    b.fault("sigkill", "relay-0")
    b.fault("sigstop", "consumer-1")
    b.fault("rebalance", "billing")
    return b


class Pick(Protocol):
    def __call__(self, items: Sequence[T]) -> T: ...


def first(items: Sequence[T]) -> T:
    return items[0]


def _replace(items: list[Any], old: Any, new: Any) -> None:
    items[items.index(old)] = new


def lost_unpublished(b: Builder, pick: Pick) -> None:
    b.write(pick(["k1", "k9", None]), publish=False)


def lost_dropped(b: Builder, pick: Pick) -> None:
    gone = pick(b.committed()).event_id
    b.h.kafka = [r for r in b.h.kafka if r.event_id != gone]


def phantom_rolled_back(b: Builder, pick: Pick) -> None:
    b.write(pick(["k1", None]), outcome=W.ROLLED_BACK, publish=True, settle=None)


def phantom_rejected(b: Builder, pick: Pick) -> None:
    b.write("k1", outcome=W.REJECTED, ikey=pick(b.committed()).idempotency_key, publish=True)


def phantom_never_written(b: Builder, pick: Pick) -> None:
    ghost = dataclasses.replace(pick(b.committed()), event_id="ghost", seq=None)
    b.publish(ghost, event_id=pick(["ghost", None]))


def duplicate_in_kafka(b: Builder, pick: Pick) -> None:
    b.publish(pick(b.committed()))


def reordered_swap(b: Builder, pick: Pick) -> None:
    live = {op.event_id: op for op in b.committed(keyed=True)}
    recs = sorted(
        (r for r in b.h.kafka if r.event_id in live), key=lambda r: (r.topic, r.partition, r.offset)
    )
    same_key = [
        (x, y)
        for i, x in enumerate(recs)
        for y in recs[i + 1 :]
        if (x.topic, x.key, x.partition) == (y.topic, y.key, y.partition)
    ]
    x, y = pick(same_key)
    _replace(b.h.kafka, x, dataclasses.replace(x, offset=y.offset))
    _replace(b.h.kafka, y, dataclasses.replace(y, offset=x.offset))


def reordered_stray(b: Builder, pick: Pick) -> None:
    old = pick(b.committed(keyed=True))
    op = b.write(old.key, topic=old.topic, publish=False)
    b.publish(op, partition=(b.partition(op) + 1) % PARTITIONS)
    b.settle(op, "succeeded")


def effect_twice(b: Builder, pick: Pick) -> None:
    s = pick(b.succeeded())
    b.h.effects.append(ConsumerEffect(s.consumer, s.event_id, 1))


def effect_after_cancel(b: Builder, pick: Pick) -> None:
    s = pick(b.succeeded())
    _replace(b.h.inbox, s, dataclasses.replace(s, state="cancelled"))


def never_settled(b: Builder, pick: Pick) -> None:
    s = pick(b.succeeded())
    b.h.inbox = [x for x in b.h.inbox if (x.consumer, x.event_id) != (s.consumer, s.event_id)]
    b.h.effects = [x for x in b.h.effects if (x.consumer, x.event_id) != (s.consumer, s.event_id)]


def succeeded_without_effect(b: Builder, pick: Pick) -> None:
    s = pick(b.succeeded())
    b.h.effects = [x for x in b.h.effects if (x.consumer, x.event_id) != (s.consumer, s.event_id)]


def two_terminal_states(b: Builder, pick: Pick) -> None:
    s = pick(b.succeeded())
    b.h.inbox.append(dataclasses.replace(s, state=pick(["cancelled", "dead", "succeeded"])))


def two_rows_one_state(b: Builder, pick: Pick) -> None:
    s = pick(b.succeeded())
    _replace(b.h.inbox, s, dataclasses.replace(s, rows=2))


def stuck_processing(b: Builder, pick: Pick) -> None:
    s = pick(b.succeeded())
    b.h.effects = [x for x in b.h.effects if (x.consumer, x.event_id) != (s.consumer, s.event_id)]
    _replace(b.h.inbox, s, dataclasses.replace(s, state="processing"))


def relay_token_down(b: Builder, pick: Pick) -> None:
    obs = pick(b.h.relay_tokens)
    top = max(o.token for o in b.h.relay_tokens if o.shard == obs.shard)
    b.h.relay_tokens.append(dataclasses.replace(obs, token=top - 1, observer="r1"))


def inbox_token_down(b: Builder, pick: Pick) -> None:
    obs = pick(b.h.inbox_tokens)
    b.h.inbox_tokens.append(dataclasses.replace(obs, token=obs.token - 1))


def second_row(b: Builder, pick: Pick, *, same_content: bool) -> None:
    old = pick(b.committed())
    digest = old.digest if same_content else _digest("changed")
    b.write(old.key, topic=old.topic, ikey=old.idempotency_key, digest=digest)


def duplicate_of_other_content(b: Builder, pick: Pick) -> None:
    b.duplicate_of(pick(b.committed()), digest=_digest("changed"))


def duplicate_names_wrong_event(b: Builder, pick: Pick) -> None:
    old = pick(b.committed())
    b.write(
        old.key,
        topic=old.topic,
        outcome=W.DUPLICATE,
        ikey=old.idempotency_key,
        digest=old.digest,
        existing="ev-9999",
    )


def same_content_rejected(b: Builder, pick: Pick) -> None:
    old = pick(b.committed())
    b.reject_of(old, digest=old.digest)


K = AnomalyKind
INJECTIONS: list[tuple[AnomalyKind, Callable[[Builder, Pick], None]]] = [
    (K.LOST, lost_unpublished),
    (K.LOST, lost_dropped),
    (K.PHANTOM, phantom_rolled_back),
    (K.PHANTOM, phantom_rejected),
    (K.PHANTOM, phantom_never_written),
    (K.DUPLICATE_IN_KAFKA, duplicate_in_kafka),
    (K.REORDERED, reordered_swap),
    (K.REORDERED, reordered_stray),
    (K.DUPLICATE_EFFECT, effect_twice),
    (K.DUPLICATE_EFFECT, effect_after_cancel),
    (K.MISSING_EFFECT, never_settled),
    (K.MISSING_EFFECT, succeeded_without_effect),
    (K.TERMINAL_STATE_COUNT, two_terminal_states),
    (K.TERMINAL_STATE_COUNT, two_rows_one_state),
    (K.TERMINAL_STATE_COUNT, stuck_processing),
    (K.TOKEN_DECREASED, relay_token_down),
    (K.TOKEN_DECREASED, inbox_token_down),
    (K.IDEMPOTENCY, lambda b, pick: second_row(b, pick, same_content=True)),
    (K.IDEMPOTENCY, lambda b, pick: second_row(b, pick, same_content=False)),
    (K.IDEMPOTENCY, duplicate_of_other_content),
    (K.IDEMPOTENCY, duplicate_names_wrong_event),
    (K.IDEMPOTENCY, same_content_rejected),
]
IDS = [f"{kind.value}-{i}" for i, (kind, _) in enumerate(INJECTIONS)]
TOLERANT_STILL_FLAGS = [(k, f) for k, f in INJECTIONS if k in (K.LOST, K.PHANTOM, K.REORDERED)]


def test_clean_history_passes() -> None:
    report = check(clean().h, exactly_once=True)
    assert report.ok, report.summary_lines()
    assert set(report.counts.values()) == {0}
    t = report.totals
    assert (t.writes, t.committed, t.rolled_back, t.duplicates, t.rejected, t.unknown) == (
        (12, 7, 1, 1, 1, 2)
    )
    assert (t.published, t.kafka_records, t.kafka_duplicate_copies) == (8, 8, 0)
    assert t.faults == {"rebalance": 1, "sigkill": 1, "sigstop": 1}
    assert t.consumed == 15  # 7 order events x 2 consumers + 1 payment event x 1
    assert t.effects == 13  # the dead event's two settlements have no effect


@pytest.mark.parametrize(("kind", "inject"), INJECTIONS, ids=IDS)
def test_each_planted_anomaly_is_flagged_alone(
    kind: AnomalyKind, inject: Callable[[Builder, Pick], None]
) -> None:
    b = clean()
    inject(b, first)
    report = check(b.h, exactly_once=True)
    assert report.flagged == [kind], report.summary_lines()
    assert report.counts[kind] == 1
    assert len(report.examples[kind]) == 1
    assert not report.ok
    assert report.summary_lines()[-1].endswith("FAIL")


@pytest.mark.parametrize(("kind", "inject"), TOLERANT_STILL_FLAGS)
def test_at_least_once_still_flags_lost_phantom_reorder(
    kind: AnomalyKind, inject: Callable[[Builder, Pick], None]
) -> None:
    b = clean()
    inject(b, first)
    assert check(b.h, exactly_once=False).flagged == [kind]


@pytest.mark.parametrize("known_by", ["writer", "record"])
def test_commit_order_comes_from_the_writer_or_else_the_record(known_by: str) -> None:
    b = clean()
    reordered_swap(b, first)
    if known_by == "writer":  # payloads carried no sequence: the writer's record decides
        b.h.kafka = [dataclasses.replace(r, seq=None) for r in b.h.kafka]
    else:  # the writer assigned none: the sequence read back from the payload decides
        b.h.writes = [dataclasses.replace(op, seq=None) for op in b.h.writes]
    assert check(b.h, exactly_once=True).flagged == [K.REORDERED]


def test_two_events_with_one_sequence_number_are_not_an_order() -> None:
    b = clean()
    op = b.committed(keyed=True)[-1]
    assert op.seq is not None
    b.seq[(op.topic, op.key or "")] = op.seq - 1  # the key's counter handed the number out twice
    b.write(op.key, topic=op.topic)
    assert check(b.h, exactly_once=True).flagged == [K.REORDERED]


def test_at_least_once_counts_kafka_duplicates_without_failing() -> None:
    b = clean()
    for op in b.committed(keyed=True)[:2]:  # a relay replaying a batch after a crash
        b.publish(op)
    report = check(b.h, exactly_once=False)
    assert report.ok
    assert report.counts[K.DUPLICATE_IN_KAFKA] == 2
    assert report.totals.kafka_duplicate_copies == 2
    assert any("(tolerated)" in line for line in report.summary_lines())
    assert check(b.h, exactly_once=True).flagged == [K.DUPLICATE_IN_KAFKA]


def test_examples_are_capped_but_all_counted() -> None:
    b = clean()
    for _ in range(8):
        b.write("k1", publish=False)
    report = check(b.h, exactly_once=True, max_examples=3)
    assert report.counts[K.LOST] == 8
    assert len(report.examples[K.LOST]) == 3


def test_summary_table_names_every_kind() -> None:
    b = clean()
    lost_unpublished(b, first)
    lines = check(b.h, exactly_once=True).summary_lines()
    text = "\n".join(lines)
    for kind in AnomalyKind:
        assert any(line.startswith(kind.value + " ") for line in lines), kind
    assert "sigkill 1" in text
    lost_line = next(line for line in lines if line.startswith("lost "))
    assert lost_line.split()[1] == "1"
    assert "ev-" in lost_line


def test_json_round_trip_is_exact_and_stable() -> None:
    h = clean().h
    text = h.to_json()
    again = History.from_json(text)
    assert again == h
    assert again.to_json() == text
    data = json.loads(text)
    assert data["format"] == 1
    assert data["writes"][0]["outcome"] == "committed"
    assert check(again, exactly_once=True).to_dict() == check(h, exactly_once=True).to_dict()


@pytest.mark.parametrize(
    "change",
    [
        {"format": 2},
        {"format": None},
        {"writes": [{"event_id": "x"}]},
        {"surprise": 1},
        {"params": {"seed": "not a number"}},
    ],
)
def test_json_refuses_other_formats_and_bad_content(change: dict[str, Any]) -> None:
    data = json.loads(clean().h.to_json())
    data.update(change)
    if change.get("format", 1) is None:
        del data["format"]
    with pytest.raises(HistoryFormatError):
        History.from_json(json.dumps(data))


@pytest.mark.parametrize("text", ["[1, 2]", '{"format": 1, "x": NaN}', "{", ""])
def test_json_refuses_what_is_not_a_history_object(text: str) -> None:
    with pytest.raises(HistoryFormatError):
        History.from_json(text)


def test_json_refuses_to_write_nan() -> None:
    b = clean()
    b.h.faults.append(Fault("sigkill", "relay-1", float("nan")))
    with pytest.raises(HistoryFormatError):
        b.h.to_json()


ACTIONS = ("commit", "dead", "rollback", "unknown_published", "unknown_lost", "dup", "reject")


@st.composite
def clean_builders(draw: st.DrawFn) -> Builder:
    """A random correct run: writes of every outcome, leases, faults, Kafka read in any order."""
    b = Builder(seed=draw(st.integers(0, 2**32 - 1)))
    b.lease(0, takeover=True)
    b.write("k0")
    b.write("k0")
    steps = st.tuples(
        st.sampled_from(ACTIONS), st.sampled_from(["k0", "k1", "k2", None]), st.sampled_from(TOPICS)
    )
    for action, key, topic in draw(st.lists(steps, max_size=30)):
        if action in ("commit", "dead"):
            b.write(key, topic=topic, settle="succeeded" if action == "commit" else "dead")
        elif action == "rollback":
            b.write(key, topic=topic, outcome=W.ROLLED_BACK)
        elif action.startswith("unknown"):
            b.write(key, topic=topic, outcome=W.UNKNOWN, publish=action == "unknown_published")
        elif action == "dup":
            b.duplicate_of(draw(st.sampled_from(b.committed())))
        else:
            b.reject_of(draw(st.sampled_from(b.committed())))
        if draw(st.booleans()):
            b.lease(draw(st.integers(0, 1)), takeover=draw(st.booleans()))
        if draw(st.integers(0, 4)) == 0:
            b.fault(draw(st.sampled_from(["sigkill", "sigstop", "rebalance", "pg_restart"])), "x")
    b.h.kafka = draw(st.permutations(b.h.kafka))  # the checker must not rely on read order
    return b


PROPERTY = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(b=clean_builders())
def test_generated_clean_history_passes_and_round_trips(b: Builder) -> None:
    report = check(b.h, exactly_once=True)
    assert report.ok, report.summary_lines()
    assert report.totals.published == len(b.h.kafka)
    assert History.from_json(b.h.to_json()) == b.h


@pytest.mark.parametrize(("kind", "inject"), INJECTIONS, ids=IDS)
@settings(PROPERTY, max_examples=40)
@given(b=clean_builders(), data=st.data())
def test_generated_history_with_one_planted_anomaly_flags_it(
    kind: AnomalyKind, inject: Callable[[Builder, Pick], None], b: Builder, data: st.DataObject
) -> None:
    inject(b, lambda items: data.draw(st.sampled_from(items)))
    assert check(b.h, exactly_once=True).flagged == [kind]
    tolerant = check(b.h, exactly_once=False)
    assert tolerant.flagged == ([] if kind is K.DUPLICATE_IN_KAFKA else [kind])
