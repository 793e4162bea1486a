"""Prometheus metrics of one relay process, and the HTTP endpoint with ``/healthz``.

``/healthz`` answers 503 when a shard this process watches has backlog but no active holder
anywhere in the group (as last sampled from the database), or when that sample is stale: the
process has not read the group's status for longer than its grace (it cannot reach PostgreSQL,
so its gauges, whatever they say, are old). 200 otherwise.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from http.server import ThreadingHTTPServer
from typing import Any

from outboxkit.errors import ConfigurationError
from outboxkit.http_endpoint import Answer, scrape, serve

try:
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

    HAVE_PROMETHEUS = True
except ImportError:  # the `metrics` extra is optional: count into nothing
    from outboxkit.relay.null_metrics import NullMetric as Counter  # type: ignore[assignment]
    from outboxkit.relay.null_metrics import NullMetric as Gauge  # type: ignore[assignment]
    from outboxkit.relay.null_metrics import NullMetric as Histogram  # type: ignore[assignment]
    from outboxkit.relay.null_metrics import (  # type: ignore[assignment]
        NullRegistry as CollectorRegistry,
    )

    HAVE_PROMETHEUS = False

METRICS_EXTRA_MISSING = (
    "metrics_port is set but prometheus_client is not installed:"
    " pip install 'outboxkit[metrics]' (or unset metrics_port)"
)


#: How long a running full backlog count keeps the status from counting as stale.
COUNT_GRACE = 600.0


class RelayMetrics:
    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.published = Counter(
            "outboxkit_relay_published", "Rows published to Kafka.", ["shard"], registry=r
        )
        self.failed = Counter(
            "outboxkit_relay_failed_batches",
            "Batches that failed with a retriable error.",
            ["shard"],
            registry=r,
        )
        self.parked = Counter(
            "outboxkit_relay_parked", "Rows parked with a permanent error.", ["shard"], registry=r
        )
        self.lease_lost = Counter(
            "outboxkit_relay_lease_lost",
            "Leases lost while active, by reason (outboxkit.relay.lease_loss.LeaseLoss).",
            ["shard", "reason"],
            registry=r,
        )
        self.batch_seconds = Histogram(
            "outboxkit_relay_batch_seconds",
            "First-claim-to-Kafka-commit latency of one transaction (one or more claims).",
            ["shard"],
            registry=r,
            buckets=(0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )
        self.backlog = Gauge(
            "outboxkit_relay_backlog", "Pending rows per shard.", ["shard"], registry=r
        )
        self.oldest_pending = Gauge(
            "outboxkit_relay_oldest_pending_seconds",
            "Age of the oldest pending row per shard.",
            ["shard"],
            registry=r,
        )
        self.parked_rows = Gauge(
            "outboxkit_relay_parked_rows", "Parked rows per shard.", ["shard"], registry=r
        )
        self.lease_active = Gauge(
            "outboxkit_relay_lease_active",
            "1 while this process holds the shard.",
            ["shard"],
            registry=r,
        )
        self.lease_token = Gauge(
            "outboxkit_relay_lease_token",
            "Token of this process's current term (0 once a term ended).",
            ["shard"],
            registry=r,
        )
        self.group_active = Gauge(
            "outboxkit_relay_group_active",
            "1 when some relay of the group holds the shard.",
            ["shard"],
            registry=r,
        )
        self.paused = Gauge(
            "outboxkit_relay_paused",
            "1 while the relay group is paused (outboxkit relay pause), sampled.",
            registry=r,
        )
        self.status_sampled = Gauge(
            "outboxkit_relay_status_sample_timestamp_seconds",
            "Unix time of this process's last successful read of the group's status (the"
            " sampled gauges) from PostgreSQL; 0 before the first.",
            registry=r,
        )
        self._lock = threading.Lock()
        self._clock = clock
        self._stale_after: float | None = None  # set by the sampler: no sampler, no judgement
        self._fresh_at = 0.0  # clock() of the last successful sample (or of the sampler's start)
        self._count_since: float | None = None  # clock() when a running full count began
        self._paused = False

    def expect_samples(self, stale_after: float) -> None:
        """The sampler starts: from now on its gauges count as stale (and /healthz fails) once
        no sample succeeded for ``stale_after`` seconds, counted from now at first."""
        self._fresh_at = self._clock()
        self._stale_after = stale_after

    def sampled(self, paused: bool) -> None:
        """A sample succeeded (``paused``: the group's pause flag it read)."""
        self._fresh_at = self._clock()
        self._paused = paused
        self.paused.set(1 if paused else 0)
        self.status_sampled.set(time.time())

    def counting(self, running: bool) -> None:
        """A full backlog count starts or ends. Under a large backlog one takes long (about 0.3
        s per 200,000 pending rows): while it runs on a live connection, it is not staleness,
        up to :data:`COUNT_GRACE` (a count that hangs longer is)."""
        self._count_since = self._clock() if running else None

    def _stale_for(self) -> float | None:
        """Seconds since the last successful sample, when past the grace; else None."""
        if self._stale_after is None:
            return None
        now = self._clock()
        age = now - self._fresh_at
        counting = self._count_since is not None and now - self._count_since < COUNT_GRACE
        return age if age > self._stale_after and not counting else None

    def healthy(self) -> tuple[bool, dict[str, Any]]:
        """Unhealthy when a shard has backlog but no active holder in the group, or when the
        sampled gauges this decides on are stale (the group could be down, not known)."""
        problems = []
        for metric in self.backlog.collect():
            for sample in metric.samples:
                shard = sample.labels["shard"]
                if sample.value > 0 and self.group_active.labels(shard)._value.get() < 1:
                    problems.append(shard)
        detail: dict[str, Any] = {"shards_with_backlog_and_no_holder": problems}
        stale_for = self._stale_for()
        if stale_for is not None:
            detail["status_stale"] = True
            detail["status_age_seconds"] = round(stale_for, 1)
        if self._paused:
            detail["paused"] = True
        return (not problems and stale_for is None, detail)

    def serve(self, port: int, host: str = "127.0.0.1") -> ThreadingHTTPServer:
        """Starts the endpoint. An address it cannot bind is a setting to fix, so it ends the
        start-up in one line naming the settings, not a traceback."""
        if not HAVE_PROMETHEUS:
            raise ConfigurationError(METRICS_EXTRA_MISSING)

        def health(accept: str | None) -> Answer:
            ok, detail = self.healthy()
            body = json.dumps({"ok": ok, **detail}).encode()
            return (200 if ok else 503, "application/json", body)

        routes = {"/healthz": health, "/metrics": scrape(self.registry)}
        return serve(routes, host, port, "relay")
