"""Opt-in: entities collect domain events, the session writes them to the outbox when it flushes.

::

    class Order(Base, DomainEvents):
        ...
        def place(self) -> None:
            self.status = "placed"
            self.record_event(OrderPlaced(order_id=self.id))

    hook = FlushHook(Outbox()).install(Session)      # or a sessionmaker / one session

The hook runs in ``before_flush`` (and in ``before_commit``, for events recorded without any
state change), on the session's own connection: the events and the state change commit in the
same transaction or not at all. Events are taken off an entity only once they are written, so a
failed write leaves them in place.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from sqlalchemy import event
from sqlalchemy.orm import Session

from outboxkit.events import Event, Message
from outboxkit.outbox import Outbox, WriteResult

logger = logging.getLogger("outboxkit.flush_hook")

_EVENTS_ATTR = "_outboxkit_domain_events"


class DomainEvents:
    """Mixin for entities that record domain events for the outbox."""

    def record_event(self, item: Event | Message) -> None:
        self.__dict__.setdefault(_EVENTS_ATTR, []).append(item)

    def recorded_events(self) -> list[Event | Message]:
        """Events recorded and not yet written."""
        return list(self.__dict__.get(_EVENTS_ATTR, ()))


def _sources(session: Session) -> Iterator[DomainEvents]:
    seen: set[int] = set()
    for obj in (*session.new, *session.identity_map.values()):
        if isinstance(obj, DomainEvents) and obj.__dict__.get(_EVENTS_ATTR) and id(obj) not in seen:
            seen.add(id(obj))
            yield obj


class FlushHook:
    """Writes the recorded events of a session's entities to the outbox."""

    def __init__(self, outbox: Outbox | None = None) -> None:
        self.outbox = outbox or Outbox()
        self._targets: list[Any] = []

    def write_pending(self, session: Session) -> list[WriteResult]:
        """Write every recorded event now (one add_many), then forget them."""
        sources = list(_sources(session))
        if not sources:
            return []
        batches = [(src, list(src.__dict__[_EVENTS_ATTR])) for src in sources]
        items = [item for _, batch in batches for item in batch]
        results = self.outbox.add_many(session, items)
        for src, batch in batches:
            remaining = src.__dict__[_EVENTS_ATTR]
            del remaining[: len(batch)]  # keep anything recorded meanwhile
        logger.debug("wrote %d domain event(s) from %d entities", len(items), len(sources))
        return results

    def _before_flush(self, session: Session, flush_context: Any, instances: Any) -> None:
        self.write_pending(session)

    def _before_commit(self, session: Session) -> None:
        self.write_pending(session)

    def install(self, target: Any) -> FlushHook:
        """Listen on a Session, a sessionmaker, or a Session class (e.g. ``Session``)."""
        event.listen(target, "before_flush", self._before_flush)
        event.listen(target, "before_commit", self._before_commit)
        self._targets.append(target)
        return self

    def remove(self) -> None:
        for target in self._targets:
            event.remove(target, "before_flush", self._before_flush)
            event.remove(target, "before_commit", self._before_commit)
        self._targets.clear()
