"""Judge a recorded run: every guarantee outboxkit owes becomes one named anomaly kind.

Pure logic over a :class:`History`. Each kind is checked on its own so that one fault shows up as
one kind: events that are phantoms are left out of the ordering and consumer checks, lost events
out of the consumer checks, and ordering looks only at an event's first copy in Kafka, so a
duplicate is a duplicate and not also a reordering. That keeps a report readable and lets the
tests prove each kind can be raised alone.
"""

from __future__ import annotations

import enum
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from outboxkit.verify.history import (
    INBOX_SUCCEEDED,
    INBOX_TERMINAL_STATES,
    History,
    InboxState,
    KafkaRecord,
    WriteOp,
    WriteOutcome,
)

DEFAULT_MAX_EXAMPLES = 5


class AnomalyKind(enum.StrEnum):
    LOST = "lost"  # a committed event never reached Kafka
    PHANTOM = "phantom"  # a rolled-back, refused or never-written event (or no event id) in Kafka
    DUPLICATE_IN_KAFKA = "duplicate_in_kafka"  # an event id more than once (exactly-once only)
    REORDERED = "reordered"  # per key: not one partition, or not in commit order
    DUPLICATE_EFFECT = "duplicate_effect"  # more effects than the terminal state allows
    MISSING_EFFECT = "missing_effect"  # a published event a consumer never settled, or no effect
    TERMINAL_STATE_COUNT = "terminal_state_count"  # not exactly one terminal inbox row
    TOKEN_DECREASED = "token_decreased"  # a fencing token lower than one seen before, same lease
    IDEMPOTENCY = "idempotency"  # same key gave two rows, or other content was not refused


@dataclass(frozen=True)
class Totals:
    """What the run did, for the summary: proof that the run exercised something."""

    writes: int
    committed: int
    rolled_back: int
    duplicates: int
    rejected: int
    unknown: int
    kafka_records: int
    published: int  # distinct committed (or unknown-outcome) events found in Kafka
    kafka_duplicate_copies: int
    consumed: int  # (consumer, event) pairs with a terminal inbox state
    effects: int
    token_observations: int
    faults: dict[str, int] = field(default_factory=dict)

    @property
    def faults_total(self) -> int:
        return sum(self.faults.values())


@dataclass
class Report:
    """Anomaly counts with a few example ids each; ``ok`` when nothing intolerable was found."""

    exactly_once: bool
    seed: int
    counts: dict[AnomalyKind, int]
    examples: dict[AnomalyKind, list[str]]
    totals: Totals

    @property
    def tolerated(self) -> frozenset[AnomalyKind]:
        """Kinds counted but not failing the run: at-least-once mode may duplicate in Kafka."""
        if self.exactly_once:
            return frozenset()
        return frozenset({AnomalyKind.DUPLICATE_IN_KAFKA})

    @property
    def flagged(self) -> list[AnomalyKind]:
        return [k for k in AnomalyKind if self.counts[k] and k not in self.tolerated]

    @property
    def ok(self) -> bool:
        return not self.flagged

    def summary_lines(self) -> list[str]:
        t = self.totals
        mode = "exactly-once" if self.exactly_once else "at-least-once"
        faults = ", ".join(f"{kind} {n}" for kind, n in sorted(t.faults.items())) or "none"
        lines = [
            f"outboxkit verify: seed {self.seed}, {mode}",
            f"{'writes':<12}{t.writes} attempted: {t.committed} committed, {t.rolled_back} rolled"
            f" back, {t.duplicates} duplicate, {t.rejected} rejected, {t.unknown} unknown",
            f"{'kafka':<12}{t.kafka_records} records: {t.published} events published,"
            f" {t.kafka_duplicate_copies} duplicate copies",
            f"{'consumers':<12}{t.consumed} (consumer, event) settled, {t.effects} effects",
            f"{'tokens':<12}{t.token_observations} observations",
            f"{'faults':<12}{t.faults_total} injected: {faults}",
            f"{'anomaly':<22}{'count':>7}  examples",
        ]
        for kind in AnomalyKind:
            note = " (tolerated)" if kind in self.tolerated and self.counts[kind] else ""
            examples = ", ".join(self.examples[kind])
            lines.append(f"{kind.value:<22}{self.counts[kind]:>7}  {examples}{note}".rstrip())
        lines.append(f"{'result':<12}{'PASS' if self.ok else 'FAIL'}")
        return lines

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "exactly_once": self.exactly_once,
            "seed": self.seed,
            "counts": {k.value: n for k, n in self.counts.items()},
            "examples": {k.value: list(v) for k, v in self.examples.items()},
            "totals": asdict(self.totals),
        }


class _Found:
    """Counts per kind, keeping the first few examples of each."""

    def __init__(self, max_examples: int) -> None:
        self.max_examples = max_examples
        self.counts: dict[AnomalyKind, int] = dict.fromkeys(AnomalyKind, 0)
        self.examples: dict[AnomalyKind, list[str]] = {k: [] for k in AnomalyKind}

    def add(self, kind: AnomalyKind, example: str) -> None:
        self.counts[kind] += 1
        if len(self.examples[kind]) < self.max_examples:
            self.examples[kind].append(example)


def check(
    history: History, *, exactly_once: bool, max_examples: int = DEFAULT_MAX_EXAMPLES
) -> Report:
    """Check every guarantee against the history; see :class:`AnomalyKind` for what each means."""
    found = _Found(max_examples)
    live = _live_events(history.writes)
    records = sorted(history.kafka, key=lambda r: (r.topic, r.partition, r.offset))
    copies = _check_kafka(records, history.writes, live, found)
    _check_order(records, live, found)
    _check_idempotency(history.writes, found)
    settled = _check_consumers(history, records, live, found)
    _check_tokens(((o.lease, o.token, o.time) for o in history.relay_tokens), found)
    _check_tokens(((o.lease, o.token, o.time) for o in history.inbox_tokens), found)
    outcomes = Counter(op.outcome for op in history.writes)
    totals = Totals(
        writes=len(history.writes),
        committed=outcomes[WriteOutcome.COMMITTED],
        rolled_back=outcomes[WriteOutcome.ROLLED_BACK],
        duplicates=outcomes[WriteOutcome.DUPLICATE],
        rejected=outcomes[WriteOutcome.REJECTED],
        unknown=outcomes[WriteOutcome.UNKNOWN],
        kafka_records=len(records),
        published=sum(1 for event_id in copies if event_id in live),
        kafka_duplicate_copies=sum(n - 1 for e, n in copies.items() if e in live),
        consumed=settled,
        effects=sum(e.count for e in history.effects),
        token_observations=len(history.relay_tokens) + len(history.inbox_tokens),
        faults=dict(sorted(Counter(f.kind for f in history.faults).items())),
    )
    return Report(
        exactly_once=exactly_once,
        seed=history.params.seed,
        counts=found.counts,
        examples=found.examples,
        totals=totals,
    )


def _live_events(writes: Sequence[WriteOp]) -> dict[str, WriteOp]:
    """Events that (may) exist as rows: committed, or of unknown outcome. Committed wins."""
    live: dict[str, WriteOp] = {}
    for op in writes:
        if op.outcome is WriteOutcome.COMMITTED:
            live.setdefault(op.event_id, op)
            if live[op.event_id].outcome is not WriteOutcome.COMMITTED:
                live[op.event_id] = op
        elif op.outcome is WriteOutcome.UNKNOWN:
            live.setdefault(op.event_id, op)
    return live


def _check_kafka(
    records: Sequence[KafkaRecord],
    writes: Sequence[WriteOp],
    live: dict[str, WriteOp],
    found: _Found,
) -> Counter[str]:
    """Lost, phantom and duplicate events; returns how many copies of each event id were read."""
    copies: Counter[str] = Counter()
    for rec in records:
        if rec.event_id is None:
            found.add(AnomalyKind.PHANTOM, f"{rec.topic}/{rec.partition}@{rec.offset} (no id)")
            continue
        copies[rec.event_id] += 1
    for event_id, n in copies.items():
        if event_id not in live:
            found.add(AnomalyKind.PHANTOM, event_id)
        elif n > 1:
            found.add(AnomalyKind.DUPLICATE_IN_KAFKA, f"{event_id} x{n}")
    lost = {op.event_id for op in writes if op.outcome is WriteOutcome.COMMITTED} - set(copies)
    for event_id in sorted(lost):
        found.add(AnomalyKind.LOST, event_id)
    return copies


def _check_order(records: Sequence[KafkaRecord], live: dict[str, WriteOp], found: _Found) -> None:
    """Per (topic, key): one partition, and first copies in strictly increasing commit sequence."""
    by_key: dict[tuple[str, str], list[KafkaRecord]] = defaultdict(list)
    for rec in records:
        op = live.get(rec.event_id or "")
        if op is not None and op.key is not None:
            by_key[(op.topic, op.key)].append(rec)
    for (topic, key), recs in sorted(by_key.items()):
        per_partition = Counter(r.partition for r in recs)
        home = min(per_partition, key=lambda p: (-per_partition[p], p))
        strays = sorted({r.event_id or "" for r in recs if r.partition != home})
        for event_id in strays:
            where = sorted(per_partition)
            found.add(AnomalyKind.REORDERED, f"{event_id} (key {key!r} in partitions {where})")
        seen: set[str] = set(strays)
        highest: int | None = None
        for rec in recs:  # already in offset order within the home partition
            event_id = rec.event_id or ""
            if rec.partition != home or event_id in seen:
                continue
            seen.add(event_id)
            seq = live[event_id].seq if live[event_id].seq is not None else rec.seq
            if seq is None:
                continue
            if highest is not None and seq <= highest:
                found.add(
                    AnomalyKind.REORDERED,
                    f"{event_id} (key {key!r} on {topic}: seq {seq} after {highest})",
                )
            else:
                highest = seq


def _check_idempotency(writes: Sequence[WriteOp], found: _Found) -> None:
    """One row per idempotency key; duplicates match its content; other content is refused."""
    by_key: dict[str, list[WriteOp]] = defaultdict(list)
    for op in writes:
        by_key[op.idempotency_key].append(op)
    for ikey, ops in sorted(by_key.items()):
        committed = [op for op in ops if op.outcome is WriteOutcome.COMMITTED]
        for extra in committed[1:]:
            same = "same" if extra.digest == committed[0].digest else "other"
            found.add(
                AnomalyKind.IDEMPOTENCY,
                f"{extra.event_id} (key {ikey!r}: second row, {same} content)",
            )
        stored = committed or [op for op in ops if op.outcome is WriteOutcome.UNKNOWN]
        for op in ops:
            if op.outcome is WriteOutcome.DUPLICATE and not any(
                ref.digest == op.digest and op.existing_event_id in (None, ref.event_id)
                for ref in stored
            ):
                found.add(
                    AnomalyKind.IDEMPOTENCY,
                    f"{op.event_id} (key {ikey!r}: duplicate of no stored row with that content)",
                )
            elif (
                op.outcome is WriteOutcome.REJECTED
                and committed
                and all(ref.digest == op.digest for ref in committed)
            ):
                found.add(
                    AnomalyKind.IDEMPOTENCY,
                    f"{op.event_id} (key {ikey!r}: same content rejected)",
                )


def _check_consumers(
    history: History,
    records: Sequence[KafkaRecord],
    live: dict[str, WriteOp],
    found: _Found,
) -> int:
    """Exactly one terminal state and the right number of effects; returns pairs settled."""
    subscribed: dict[str, list[str]] = defaultdict(list)
    for spec in history.params.consumers:
        for topic in spec.topics:
            subscribed[topic].append(spec.name)
    expected = {
        (consumer, rec.event_id)
        for rec in records
        if rec.event_id in live
        for consumer in subscribed.get(rec.topic, ())
    }
    states: dict[tuple[str, str], list[InboxState]] = defaultdict(list)
    for state in history.inbox:
        states[(state.consumer, state.event_id)].append(state)
    effects: Counter[tuple[str, str]] = Counter()
    for effect in history.effects:
        effects[(effect.consumer, effect.event_id)] += effect.count
    settled = 0
    for pair in sorted(expected | set(states) | set(effects)):
        rows = states.get(pair, [])
        total = sum(s.rows for s in rows)
        terminal = [s for s in rows if s.state in INBOX_TERMINAL_STATES and s.rows > 0]
        terminal_rows = sum(s.rows for s in terminal)
        applied = effects[pair]
        name = f"{pair[0]}/{pair[1]}"
        if total == 0 and applied == 0:
            if pair in expected:
                found.add(AnomalyKind.MISSING_EFFECT, f"{name} (never settled)")
            continue
        if terminal_rows:
            settled += 1
        if terminal_rows != 1 or total != 1:
            found.add(AnomalyKind.TERMINAL_STATE_COUNT, f"{name} ({_describe(rows)})")
        succeeded = any(s.state == INBOX_SUCCEEDED for s in terminal)
        # With no terminal state the effect cannot be judged (that pair is flagged above).
        allowed = 1 if succeeded or not terminal else 0
        if applied > allowed:
            found.add(
                AnomalyKind.DUPLICATE_EFFECT, f"{name} ({applied} effects, {_describe(rows)})"
            )
        elif succeeded and applied == 0:
            found.add(AnomalyKind.MISSING_EFFECT, f"{name} (succeeded without its effect)")
    return settled


def _describe(rows: Iterable[InboxState]) -> str:
    return ", ".join(f"{s.state} x{s.rows}" for s in rows) or "no inbox row"


def _check_tokens(observations: Iterable[tuple[str, int, float]], found: _Found) -> None:
    """Per lease, every observed token is at least the highest one observed before it."""
    highest: dict[str, int] = {}
    for lease, token, at in observations:
        top = highest.get(lease)
        if top is not None and token < top:
            found.add(AnomalyKind.TOKEN_DECREASED, f"{lease}: {token} after {top} (t={at:g})")
        else:
            highest[lease] = token
