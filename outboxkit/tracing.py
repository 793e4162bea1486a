"""W3C trace context for outbox rows, from the current OpenTelemetry context.

OpenTelemetry is an optional dependency: without it (or without an active span) no trace headers
are added. The W3C propagator is used directly, whatever global propagator the application set,
because the relay forwards exactly ``traceparent``/``tracestate``.
"""

from __future__ import annotations

import logging
from typing import Any

from outboxkit.wire import HEADER_TRACEPARENT, HEADER_TRACESTATE

logger = logging.getLogger("outboxkit.tracing")

_propagator: Any
try:
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # pragma: no cover - exercised only without the optional dependency
    _propagator = None
else:
    _propagator = TraceContextTextMapPropagator()


def otel_available() -> bool:
    return _propagator is not None


def current_trace_headers() -> dict[str, str]:
    """``traceparent`` (and ``tracestate`` when set) of the active span, or ``{}``."""
    if _propagator is None:
        return {}
    carrier: dict[str, str] = {}
    try:
        _propagator.inject(carrier)
    except Exception:  # tracing must never break a business write
        logger.debug("could not read the OpenTelemetry context", exc_info=True)
        return {}
    return {k: v for k, v in carrier.items() if k in (HEADER_TRACEPARENT, HEADER_TRACESTATE)}
