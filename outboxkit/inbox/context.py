"""What a handler gets besides the event(s) and the session: identity, attempt, lease check."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
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


@dataclass(frozen=True)
class BatchContext:
    """Passed to a batch handler: one :class:`HandlerContext` per event, in the events' order.

    Iterating it (``zip(events, ctx)``) gives each event's id, idempotency key, headers,
    attempt, partition and offset. :meth:`check` raises :class:`LeaseLostError` once the lease
    of any of the events is lost (cancelled, fenced, partition revoked): the whole call is then
    rolled back and its events are handled one by one.
    """

    consumer: str
    contexts: tuple[HandlerContext, ...]

    @classmethod
    def of(cls, ctx: HandlerContext) -> BatchContext:
        """The context of a call with one event."""
        return cls(ctx.consumer, (ctx,))

    def __len__(self) -> int:
        return len(self.contexts)

    def __iter__(self) -> Iterator[HandlerContext]:
        return iter(self.contexts)

    def __getitem__(self, index: int) -> HandlerContext:
        return self.contexts[index]

    @property
    def event_ids(self) -> list[str]:
        return [ctx.event_id for ctx in self.contexts]

    @property
    def idempotency_keys(self) -> list[str]:
        return [ctx.idempotency_key for ctx in self.contexts]

    @property
    def lease_lost(self) -> bool:
        return any(ctx.lease_lost for ctx in self.contexts)

    def check(self) -> None:
        for ctx in self.contexts:
            ctx.check()
