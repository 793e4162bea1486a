"""The per-event objects built field by field (``outboxkit.inbox.frozen.build``) are the very
objects their dataclass constructor builds: every field set, equal, still frozen."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from outboxkit.inbox.context import HandlerContext
from outboxkit.inbox.delivery import InboxSettings, handler_context
from outboxkit.inbox.envelope import Envelope, Identity, identify
from outboxkit.inbox.lease import LeaseHandle
from outboxkit.inbox.outcome import Outcome, OutcomeKind
from outboxkit.inbox.registry import EventRegistry
from outboxkit.inbox.store import Claim
from outboxkit.kafka.api import ConsumedRecord

pytestmark = pytest.mark.unit

HEADERS = (("event-id", b"e1"), ("event-type", b"t"), ("idempotency-key", b"k"), ("x", None))
RECORD = ConsumedRecord("orders", 3, 42, b"key", b"{}", HEADERS, -1, None)


def _same(built: Any, expected: Any) -> None:
    # build() skips __init__: a class built with it must not gain a __post_init__ (validation)
    assert not hasattr(type(expected), "__post_init__")
    names = {f.name for f in dataclasses.fields(expected)}
    assert set(vars(built)) == names
    assert type(built) is type(expected)
    assert built == expected
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.topic = "other"


def test_envelope_from_record() -> None:
    expected = Envelope(
        "orders",
        3,
        42,
        b"key",
        b"{}",
        {"event-id": "e1", "event-type": "t", "idempotency-key": "k"},
        HEADERS,
        None,
        None,
    )
    _same(Envelope.from_record(RECORD), expected)


def test_identity() -> None:
    ident = identify(Envelope.from_record(RECORD))
    _same(ident, Identity("e1", "k", "t", "application/json", ident.digest))


def test_claim_and_outcome() -> None:
    _same(Claim.claimed(7, 2, "boom"), Claim("claimed", 7, 2, "boom"))
    _same(Outcome.succeeded("e1", 2), Outcome(OutcomeKind.SUCCEEDED, "e1", 2))


def test_handler_context() -> None:
    env = Envelope.from_record(RECORD)
    ident, claim = identify(env), Claim.claimed(7, 2, None)
    settings = InboxSettings(consumer="c", registry=EventRegistry())
    ctx = handler_context(settings, env, ident, claim, LeaseHandle("e1", 7, 0.0), lambda: False)
    expected = HandlerContext(
        "c", "e1", "k", "t", dict(env.headers), 2, "orders", 3, 42, 7, ctx._lost_reason
    )
    _same(ctx, expected)
    assert ctx.headers is not env.headers  # the handler's own copy
    ctx.check()
