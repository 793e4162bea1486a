"""What a handler gets besides the event and the session: identity, attempt, lease check."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from outboxkit.errors import LeaseLostError


@dataclass(frozen=True)
class HandlerContext:
    """Passed to every handler call.

    ``idempotency_key`` is the value to send to external systems (payments, email) so that a
    retried or redelivered call is applied once downstream. Long handlers call :meth:`check`
    between steps: it raises :class:`LeaseLostError` once the lease is lost (partition revoked,
    renewal refused, event cancelled), so the handler stops early; the transaction is then
    rolled back anyway.
    """

    consumer: str
    event_id: str
    idempotency_key: str
    event_type: str | None
    headers: Mapping[str, str]
    attempt: int
    topic: str
    partition: int
    offset: int
    lease_token: int
    _lost_reason: Callable[[], str | None] = field(repr=False, default=lambda: None)

    @property
    def lease_lost(self) -> bool:
        return self._lost_reason() is not None

    def check(self) -> None:
        reason = self._lost_reason()
        if reason is not None:
            raise LeaseLostError(f"lease on event {self.event_id!r} lost: {reason}")
