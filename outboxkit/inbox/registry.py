"""Event types to pydantic models and handlers: how a consumer turns bytes into a typed call.

The event type comes from the class, as the writer declares it::

    class OrderPlaced(Event, topic="orders", event_type="order.placed"): ...

    registry = EventRegistry()

    @registry.handler(OrderPlaced)
    def ship(event: OrderPlaced, ctx: HandlerContext, session: Session) -> None: ...

A plain pydantic model (not an :class:`outboxkit.Event`) names its type: ``register(Model,
event_type="order.placed")``. For bulk effects a type may have a batch handler instead, called
with all the events of that type in a batch (see :mod:`outboxkit.inbox.batch_handler`)::

    @registry.batch_handler(OrderPlaced)
    def ship_all(events: Sequence[OrderPlaced], ctx: BatchContext, session: Session) -> None: ...
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import pydantic

from outboxkit.errors import ConfigurationError, DecodeError, UnknownEventTypeError
from outboxkit.events import Event
from outboxkit.inbox.batch_handler import OneAtATime
from outboxkit.inbox.guard import error_text, excerpt
from outboxkit.wire import JSON_CONTENT_TYPE

HandlerT = TypeVar("HandlerT", bound=Callable[..., Any])


def event_type_of(model: type[pydantic.BaseModel], event_type: str | None = None) -> str:
    """The type an event class declares (``Event`` subclasses), or the one given for it."""
    if event_type is not None:
        return event_type
    if isinstance(model, type) and issubclass(model, Event) and model.__outbox__ is not None:
        return model.__outbox__.event_type
    raise ConfigurationError(
        f"{getattr(model, '__name__', model)!r} declares no event type: register an"
        " outboxkit.Event class with a topic, or pass event_type= for a plain pydantic model"
    )


class EventRegistry:
    """Maps the ``event-type`` header to the model the handler receives, and to its handler."""

    def __init__(self) -> None:
        self._models: dict[str, type[pydantic.BaseModel]] = {}
        self._handlers: dict[str, Callable[..., Any]] = {}
        self._batch_handlers: dict[str, Callable[..., Any]] = {}
        self._one_at_a_time: dict[str, OneAtATime] = {}

    def register(self, model: type[pydantic.BaseModel], *, event_type: str | None = None) -> str:
        """Decode deliveries of the model's event type into it; returns that type."""
        name = event_type_of(model, event_type)
        if self._models.get(name, model) is not model:
            raise ConfigurationError(f"event type {name!r} is already registered")
        self._models[name] = model
        return name

    def handler(
        self, *models: type[pydantic.BaseModel], event_type: str | None = None
    ) -> Callable[[HandlerT], HandlerT]:
        """Decorator: the function handles deliveries of these models' event types.

        Sync functions serve an ``Inbox``, coroutine functions an ``AsyncInbox``.
        """
        return self._decorator("handler", self._handlers, models, event_type)

    def batch_handler(
        self, *models: type[pydantic.BaseModel], event_type: str | None = None
    ) -> Callable[[HandlerT], HandlerT]:
        """Decorator: ``fn(events, ctx, session)`` handles these types' events in bulk.

        In a batch it is called once with the batch's events of its types (a
        :class:`~outboxkit.inbox.context.BatchContext` per call); if that call fails, once per
        event. Elsewhere (one record at a time, retries) with one event. A type has either a
        handler or a batch handler.
        """
        return self._decorator("batch_handler", self._batch_handlers, models, event_type)

    def _decorator(
        self,
        kind: str,
        table: dict[str, Callable[..., Any]],
        models: tuple[type[pydantic.BaseModel], ...],
        event_type: str | None,
    ) -> Callable[[HandlerT], HandlerT]:
        if not models or (event_type is not None and len(models) != 1):
            raise ConfigurationError(f"{kind}() takes the model(s) it handles")

        other = self._handlers if table is self._batch_handlers else self._batch_handlers

        def decorate(fn: HandlerT) -> HandlerT:
            for name in [event_type_of(model, event_type) for model in models]:
                if table.get(name, fn) is not fn or name in other:
                    raise ConfigurationError(f"event type {name!r} already has a handler")
            for model in models:
                name = self.register(model, event_type=event_type)
                table[name] = fn
                if table is self._batch_handlers:
                    self._one_at_a_time[name] = OneAtATime(fn)
            return fn

        return decorate

    @property
    def event_types(self) -> frozenset[str]:
        return frozenset(self._models)

    @property
    def handlers(self) -> Mapping[str, Callable[..., Any]]:
        return dict(self._handlers)

    @property
    def batch_handlers(self) -> Mapping[str, Callable[..., Any]]:
        return dict(self._batch_handlers)

    def handler_for(self, event_type: str | None) -> Callable[..., Any] | None:
        """The per-event handler of the type; a batch handler's is a call with ``[event]``."""
        if event_type is None:
            return None
        return self._handlers.get(event_type) or self._one_at_a_time.get(event_type)

    def batch_handler_for(self, event_type: str | None) -> Callable[..., Any] | None:
        return self._batch_handlers.get(event_type) if event_type is not None else None

    def check_handlers(self, *, coroutines: bool, fallback: Callable[..., Any] | None) -> None:
        """Refuse handlers of the wrong kind (a coroutine function for the sync inbox, or not)."""
        for name, fn in [*self._handlers.items(), *self._batch_handlers.items(), ("*", fallback)]:
            if fn is None:
                continue
            if coroutines and inspect.isfunction(fn) and not inspect.iscoroutinefunction(fn):
                raise ConfigurationError(f"the AsyncInbox handler for {name!r} must be async")
            if not coroutines and inspect.iscoroutinefunction(fn):
                raise ConfigurationError(f"the Inbox handler for {name!r} must not be async")

    def decode(self, event_type: str | None, content_type: str, payload: bytes | None) -> object:
        """The typed event, or :class:`DecodeError` with a reason fit for the rejection record
        (whatever the model's validation raised)."""
        if event_type is None:
            raise UnknownEventTypeError("the message has no event-type header")
        model = self._models.get(event_type)
        if model is None:
            raise UnknownEventTypeError(f"unknown event type {excerpt(repr(event_type))}")
        if content_type.split(";")[0].strip() != JSON_CONTENT_TYPE:
            raise DecodeError(f"unsupported content type {excerpt(repr(content_type))}")
        try:
            return model.model_validate_json(payload or b"")
        except RecursionError as exc:  # a validator recursing through deeply nested input
            raise DecodeError(f"payload of {event_type!r} nests too deeply") from exc
        except pydantic.ValidationError as exc:
            errors = exc.errors()
            where = f"{errors[0]['msg']} at {list(errors[0]['loc'])}" if errors else "invalid"
            where = excerpt(where)
            raise DecodeError(f"payload is not a valid {event_type!r}: {where}") from exc
        except Exception as exc:
            # pydantic wraps only ValueError and AssertionError: anything else a validator
            # raises (a TypeError, a KeyError) for this payload is this record's fault, not the
            # batch's, and would fail again on every delivery.
            raise DecodeError(
                f"payload of {event_type!r} could not be decoded: {error_text(exc)}"
            ) from exc
