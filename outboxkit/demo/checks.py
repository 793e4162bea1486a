"""The final verification: what the database says happened, against what the writers did.

Every check is computed from the rows, not from the story the demo told; one failing check makes
``outboxkit demo`` exit non-zero.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import sqlalchemy as sa

from outboxkit.demo.app import LIFECYCLE, demo_applied, demo_charge, demo_order
from outboxkit.demo.writers import WriteLog

PASS, FAIL = "\u2714", "\u2718"  # check mark, cross
GREEN, RED, RESET = "\x1b[32m", "\x1b[31m", "\x1b[0m"


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str


@dataclass(frozen=True)
class Faults:
    """What the scenario did and saw, for the checks that judge it."""

    takeover_seconds: float | None  # SIGKILL of the active relay -> the standby's new term
    token_before: int | None
    token_after: int | None
    consumer_killed: bool  # by the after_db_commit fault point
    duplicates_suppressed: int
    takeover_limit: float
    # records beyond one per event id in the topic, read back read_committed (None: not read)
    copies_in_kafka: int | None = None


@dataclass(frozen=True)
class Outcome:
    """What the consumer's side of the database holds after the run."""

    orders: set[str]  # demo_order ids (only committed orders exist)
    charges: Counter[str]  # charges per order id
    applied: list[tuple[str, int, str]]  # (order id, seq, event id) in the order applied


def read_outcome(engine: sa.Engine) -> Outcome:
    with engine.connect() as conn:
        orders = {str(r[0]) for r in conn.execute(sa.select(demo_order.c.id))}
        charges = Counter(str(r[0]) for r in conn.execute(sa.select(demo_charge.c.order_id)))
        applied = conn.execute(
            sa.select(
                demo_applied.c.order_id, demo_applied.c.seq, demo_applied.c.event_id
            ).order_by(demo_applied.c.id)
        ).all()
    return Outcome(orders, charges, [(str(o), int(seq), str(e)) for o, seq, e in applied])


def judge(log: WriteLog, outcome: Outcome, faults: Faults) -> list[Check]:
    """Every row of the verification table (pure: the unit tests feed it broken outcomes)."""
    events = [event for _, _, event in outcome.applied]
    every_event = _every_event_once(log, events)
    return [
        _charged_once(log, outcome.orders, outcome.charges),
        every_event,
        _nothing_phantom(log, outcome.orders, outcome.charges, events),
        _order_kept(log, [(order, seq) for order, seq, _ in outcome.applied]),
        _takeover(faults),
        _duplicate_suppressed(faults),
        _relay_exactly_once(faults, every_event.ok),
        Check("no writer errors", not log.errors, "; ".join(log.errors[:2]) or "none"),
    ]


def _charged_once(log: WriteLog, orders: set[str], charges: Counter[str]) -> Check:
    committed = set(log.orders)
    once = sum(1 for order in committed if charges.get(order) == 1)
    twice = sum(1 for count in charges.values() if count > 1)
    ok = orders == committed and once == len(committed)
    detail = f"{once} of {len(committed)} committed orders charged once, {twice} more than once"
    return Check("every committed order charged exactly once", ok, detail)


def _every_event_once(log: WriteLog, applied: list[str]) -> Check:
    counts = Counter(applied)
    missing = sum(1 for event in log.committed if event not in counts)
    doubled = sum(1 for count in counts.values() if count > 1)
    ok = missing == 0 and doubled == 0
    detail = (
        f"{len(counts)} of {len(log.committed)} events applied, {missing} lost, {doubled} twice"
    )
    return Check("every committed event applied exactly once", ok, detail)


def _nothing_phantom(
    log: WriteLog, orders: set[str], charges: Counter[str], applied: list[str]
) -> Check:
    phantom_events = sum(1 for event in applied if event in log.rolled_back)
    phantom_charges = sum(count for order, count in charges.items() if order not in orders)
    ok = phantom_events == 0 and phantom_charges == 0 and log.rolled_back_transactions > 0
    detail = (
        f"{log.rolled_back_transactions} transactions rolled back; {phantom_events} of their"
        f" events applied, {phantom_charges} charges for orders that do not exist"
    )
    return Check("nothing phantom from rolled-back transactions", ok, detail)


def _order_kept(log: WriteLog, applied: list[tuple[str, int]]) -> Check:
    seen: dict[str, list[int]] = {}
    for order, seq in applied:
        seen.setdefault(order, []).append(seq)
    full = list(range(1, len(LIFECYCLE) + 1))
    wrong = sorted(order for order, seqs in seen.items() if seqs != sorted(seqs))
    complete = sum(1 for order in log.orders if seen.get(order) == full)
    ok = not wrong and complete == len(log.orders)
    detail = f"{complete} of {len(log.orders)} orders saw placed -> packed -> shipped in order"
    if wrong:
        detail += f"; out of order: {', '.join(wrong[:3])}"
    return Check("per-order event order kept", ok, detail)


def _takeover(faults: Faults) -> Check:
    seconds = faults.takeover_seconds
    grew = (
        faults.token_before is not None
        and faults.token_after is not None
        and faults.token_after > faults.token_before
    )
    ok = seconds is not None and seconds <= faults.takeover_limit and grew
    if seconds is None:
        detail = "the standby never took over"
    else:
        detail = (
            f"{seconds:.1f}s after the SIGKILL (limit {faults.takeover_limit:.0f}s: lease TTL"
            f" + 5s); fencing token {faults.token_before} -> {faults.token_after}"
        )
    return Check("standby relay took over from the killed one", ok, detail)


def _duplicate_suppressed(faults: Faults) -> Check:
    ok = faults.consumer_killed and faults.duplicates_suppressed >= 1
    detail = (
        f"consumer killed after its DB commit: {'yes' if faults.consumer_killed else 'no'};"
        f" redeliveries suppressed by the inbox: {faults.duplicates_suppressed}"
    )
    return Check("redelivered event suppressed by the inbox", ok, detail)


def _relay_exactly_once(faults: Faults, consumed_all: bool) -> Check:
    """Read from Kafka itself: each event once in the topic for a ``read_committed`` reader.
    A consumer-side redelivery (its kill, which redelivers its whole batch) is not a Kafka
    duplicate and does not count."""
    name = "relay published nothing twice across its crash"
    if faults.copies_in_kafka is not None:
        copies = faults.copies_in_kafka
        detail = f"read back from Kafka (read_committed): {copies} duplicate record(s)"
        return Check(name, copies == 0, detail)
    if not consumed_all:
        return Check(name, False, "not judged: the consumer did not see every event")
    detail = "not checked: no confluent-kafka to read the topic back with"
    return Check(name, True, detail)


def render(checks: list[Check], color: bool) -> list[str]:
    """The verification table, one row per check."""
    width = max(len(check.name) for check in checks)
    lines = []
    for check in checks:
        mark = PASS if check.ok else FAIL
        if color:
            mark = f"{GREEN if check.ok else RED}{mark}{RESET}"
        lines.append(f"  {mark}  {check.name.ljust(width)}  {check.detail}")
    return lines
