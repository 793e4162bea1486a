"""Prometheus metrics of consumer outcomes (needs the ``metrics`` extra: prometheus-client).

Pass an :class:`InboxMetrics` to an adapter (``metrics=``); the worker exposes it with
``--metrics-port``. Outcome labels are the :class:`OutcomeKind` values.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

from outboxkit.inbox.outcome import Outcome, OutcomeKind


class InboxMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.outcomes = Counter(
            "outboxkit_inbox_outcomes",
            "Deliveries settled, by consumer and outcome.",
            ["consumer", "outcome"],
            registry=self.registry,
        )
        self.seconds = Histogram(
            "outboxkit_inbox_process_seconds",
            "Claim-to-outcome latency of one delivery.",
            ["consumer"],
            registry=self.registry,
            buckets=(0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
        )

        self.alerts = Counter(
            "outboxkit_inbox_alerts",
            "Records that ended but need an operator: dead_letter_failed (dead without a"
            " dead-letter record), given_up (repeated unexpected errors).",
            ["consumer", "alert"],
            registry=self.registry,
        )

        self.batch_reruns = Counter(
            "outboxkit_inbox_batch_reruns",
            "Batched deliveries that did not commit in one go: rolled_back counts each time a"
            " batch's transaction was rolled back and its other handlers ran again (a handler"
            " failed, was cancelled or lost its lease); one_by_one each batch that failed as a"
            " whole (e.g. the database was unreachable) and whose records were then processed"
            " singly.",
            ["consumer", "reason"],
            registry=self.registry,
        )
        self._children: dict[tuple[str, OutcomeKind], tuple[Counter, Histogram]] = {}

    def observe(self, consumer: str, outcome: Outcome, seconds: float) -> None:
        # One per delivery: the labelled children are looked up once (``labels`` takes a lock
        # and builds a key on every call).
        children = self._children.get((consumer, outcome.kind))
        if children is None:
            children = (
                self.outcomes.labels(consumer, outcome.kind.value),
                self.seconds.labels(consumer),
            )
            self._children[(consumer, outcome.kind)] = children
        children[0].inc()
        if outcome.alert is not None:
            self.alerts.labels(consumer, outcome.alert).inc()
        children[1].observe(seconds)

    def batch_rerun(self, consumer: str, reason: str, count: int = 1) -> None:
        self.batch_reruns.labels(consumer, reason).inc(count)
