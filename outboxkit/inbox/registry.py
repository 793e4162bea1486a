"""Event types to pydantic models: how a consumer turns bytes into a typed event."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import pydantic

from outboxkit.errors import DecodeError, UnknownEventTypeError
from outboxkit.wire import JSON_CONTENT_TYPE

ModelT = TypeVar("ModelT", bound=type[pydantic.BaseModel])


class EventRegistry:
    """Maps the ``event-type`` header to the pydantic model the handler receives."""

    def __init__(self) -> None:
        self._models: dict[str, type[pydantic.BaseModel]] = {}

    def register(self, event_type: str, model: type[pydantic.BaseModel]) -> None:
        if event_type in self._models and self._models[event_type] is not model:
            raise ValueError(f"event type {event_type!r} is already registered")
        self._models[event_type] = model

    def event(self, event_type: str) -> Callable[[ModelT], ModelT]:
        """Class decorator form of :meth:`register`."""

        def decorate(model: ModelT) -> ModelT:
            self.register(event_type, model)
            return model

        return decorate

    @property
    def event_types(self) -> frozenset[str]:
        return frozenset(self._models)

    def decode(self, event_type: str | None, content_type: str, payload: bytes | None) -> object:
        """The typed event, or :class:`DecodeError` with a reason fit for the rejection record."""
        if event_type is None:
            raise UnknownEventTypeError("the message has no event-type header")
        model = self._models.get(event_type)
        if model is None:
            raise UnknownEventTypeError(f"unknown event type {event_type!r}")
        if content_type.split(";")[0].strip() != JSON_CONTENT_TYPE:
            raise DecodeError(f"unsupported content type {content_type!r}")
        try:
            return model.model_validate_json(payload or b"")
        except pydantic.ValidationError as exc:
            errors = exc.errors()
            where = f"{errors[0]['msg']} at {list(errors[0]['loc'])}" if errors else "invalid"
            raise DecodeError(f"payload is not a valid {event_type!r}: {where}") from exc
