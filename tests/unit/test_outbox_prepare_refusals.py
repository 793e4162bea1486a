"""What preparing a row refuses, and what its errors say: NaN and Infinity in pydantic payloads
(JSON has neither: pydantic wrote null, or a bare invalid token), and never the caller's values
(a header may be a bearer token, or a megabyte) but the field, its type and size."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, Field, PydanticUserError, computed_field

from outboxkit.errors import SerializationError, ValidationError
from outboxkit.events import Event, Message
from outboxkit.outbox import OutboxConfig
from outboxkit.outbox_plan import prepare

CONFIG = OutboxConfig()
NAN, INF = float("nan"), float("inf")
SECRET = "Bearer eyJhbGciOiJIUzI1NiJ9.s3cr3t-t0ken"


class PriceChanged(Event, topic="prices", key="sku"):
    sku: str
    price: float


class Loud(Event, topic="prices", key="sku"):
    model_config = ConfigDict(ser_json_inf_nan="constants")
    sku: str
    price: float


class AsStrings(Event, topic="prices", key="sku"):
    model_config = ConfigDict(ser_json_inf_nan="strings")
    sku: str
    price: float


class Line(BaseModel):
    price: float


class Basket(Event, topic="baskets"):
    lines: list[Line]
    totals: dict[str, float] = Field(default_factory=dict)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def first(self) -> float:
        return self.lines[0].price if self.lines else 0.0


class Plain(BaseModel):
    price: float
    note: str = ""


@pytest.mark.parametrize(
    "item",
    [
        PriceChanged(sku="s", price=NAN),
        PriceChanged(sku="s", price=-INF),
        Loud(sku="s", price=INF),
        Basket(lines=[Line(price=1), Line(price=NAN)]),
        Basket(lines=[], totals={"x": INF}),
        Message("prices", Plain(price=NAN)),
        Message("prices", Basket(lines=[Line(price=-INF)])),
    ],
    ids=["nan", "-inf", "constants", "nested", "dict", "plain_model", "event_as_payload"],
)
def test_nan_and_infinity_in_pydantic_payloads_are_refused(item: Any) -> None:
    with pytest.raises(SerializationError, match="NaN or Infinity"):
        prepare(item, CONFIG)
    with pytest.raises(SerializationError, match="NaN or Infinity"):
        prepare(item, CONFIG, idempotency_key="k")  # the per-call options' path


def test_nan_in_a_computed_field_is_refused() -> None:
    class Averaged(Event, topic="prices"):
        total: float
        count: int

        @computed_field  # type: ignore[prop-decorator]
        @property
        def mean(self) -> float:
            return self.total / self.count if self.count else NAN

    with pytest.raises(SerializationError, match="Averaged has a NaN"):
        prepare(Averaged(total=1, count=0), CONFIG)
    assert json.loads(prepare(Averaged(total=1, count=2), CONFIG).payload)["mean"] == 0.5


def test_a_model_completed_after_its_first_write_is_checked_once_complete() -> None:
    class Pending(Event, topic="prices"):
        line: LateLine  # not defined yet: pydantic cannot serialise the class

    with pytest.raises(PydanticUserError, match="not fully defined"):  # as model_dump_json
        prepare(Pending.model_construct(line=None), CONFIG)

    class LateLine(BaseModel):
        price: float

    Pending.model_rebuild()
    with pytest.raises(SerializationError, match="NaN or Infinity"):
        prepare(Pending(line=LateLine(price=NAN)), CONFIG)
    assert prepare(Pending(line=LateLine(price=1)), CONFIG).payload == b'{"line":{"price":1.0}}'


@pytest.mark.parametrize(
    "item",
    [
        PriceChanged(sku="NaN-Infinity", price=1.5),  # the bytes, in a string: a precise check
        Basket(lines=[Line(price=2.25)], totals={"Infinity": 1}),
        AsStrings(sku="s", price=NAN),  # the model asks for "NaN" strings: valid JSON
        Message("prices", Plain(price=0.5, note='say "NaN" and Infinity')),
    ],
    ids=["text", "key", "strings", "plain_model"],
)
def test_payloads_without_nan_are_written_as_pydantic_writes_them(item: Any) -> None:
    model = item.payload if isinstance(item, Message) else item
    row = prepare(item, CONFIG)
    assert row.payload == model.model_dump_json().encode()
    assert row.content_type == "application/json"
    json.loads(row.payload)


SECRET_ITEMS = {
    "header_bytes": Message("t", b"x", headers={"authorization": SECRET.encode()}),  # type: ignore[dict-item]
    "header_surrogate": Message("t", b"x", headers={"authorization": SECRET + "\udc80"}),
    "header_huge": Message("t", b"x", headers={"h": b"s" * 1_000_000}),  # type: ignore[dict-item]
    "key_bytes": Message("t", b"x", key=SECRET.encode()),  # type: ignore[arg-type]
    "event_type_bytes": Message("t", b"x", event_type=SECRET.encode()),  # type: ignore[arg-type]
    "aggregate_surrogate": Message("t", b"x", aggregate_id=SECRET + "\udc80"),
    "key_surrogate": Message("t", b"x", key=SECRET + "\ud800"),
    "schema_version": Message("t", b"x", schema_version=SECRET),  # type: ignore[arg-type]
    "deliver_after": Message("t", b"x", deliver_after=SECRET),  # type: ignore[arg-type]
}
NAMED = {
    "header_bytes": "header 'authorization' is bytes (40 bytes)",
    "header_surrogate": "header 'authorization' is not valid UTF-8",
    "header_huge": "header 'h' is bytes (1000000 bytes)",
    "key_bytes": "message key must be a str or None, got bytes (40 bytes)",
    "event_type_bytes": "event_type must be a str or None, got bytes (40 bytes)",
    "aggregate_surrogate": "aggregate_id is not valid UTF-8",
    "key_surrogate": "message key is not valid UTF-8",
    "schema_version": "got str (40 characters)",
    "deliver_after": "got str (40 characters)",
}


@pytest.mark.parametrize("name", SECRET_ITEMS)
def test_errors_name_the_field_never_the_value(name: str) -> None:
    with pytest.raises(ValidationError) as raised:
        prepare(SECRET_ITEMS[name], CONFIG)
    text = str(raised.value)
    assert NAMED[name] in text
    assert "s3cr3t" not in text
    assert "sss" not in text
    assert len(text) < 300


def test_a_long_header_name_is_shown_bounded() -> None:
    with pytest.raises(SerializationError) as raised:
        prepare(Message("t", b"x", headers={"n" * 10_000: 5}), CONFIG)  # type: ignore[dict-item]
    assert "is int" in str(raised.value)
    assert len(str(raised.value)) < 200


def test_a_models_serializer_is_not_kept_once_the_class_is_gone() -> None:
    """Classes made at run time (create_model) are not kept alive by having been written."""
    import gc
    import weakref

    from pydantic import create_model

    made = create_model("Made", price=(float, ...))
    prepare(Message("t", made(price=1.0)), CONFIG)
    gone = weakref.ref(made)
    del made
    gc.collect()
    assert gone() is None
