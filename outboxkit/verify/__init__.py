"""Checking a recorded fault-injection run: the history of what happened, and the checker.

The checker is pure logic over a :class:`~outboxkit.verify.history.History`, so a failing run can
be replayed from its JSON file and the checker itself can be tested against hand-made histories.
"""

from __future__ import annotations

from outboxkit.verify.checker import AnomalyKind, Report, Totals, check
from outboxkit.verify.history import (
    FORMAT,
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
)

__all__ = [
    "FORMAT",
    "AnomalyKind",
    "ConsumerEffect",
    "ConsumerSpec",
    "Fault",
    "History",
    "HistoryFormatError",
    "InboxState",
    "InboxTokenObservation",
    "KafkaRecord",
    "RelayTokenObservation",
    "Report",
    "RunParams",
    "TopicSpec",
    "Totals",
    "WriteOp",
    "WriteOutcome",
    "check",
]
