"""Keys that JSON would write as one object key (``{1: .., "1": ..}``): refused, for a reader
keeps only one of the values. Raw dict payloads (the standard library's spelling), headers,
and pydantic payloads (pydantic's spelling: ``None`` as ``"None"``, a tuple as ``"1,2"``).
The errors name the path and the keys' types, never the keys or the values."""

from __future__ import annotations

import enum
import json
import warnings
from collections import OrderedDict
from typing import Any

import pytest
from pydantic import BaseModel, Field, RootModel, computed_field, field_serializer

from outboxkit.errors import SerializationError
from outboxkit.events import Event, Message
from outboxkit.model_walk import NOTHING, plan_of
from outboxkit.outbox import OutboxConfig
from outboxkit.outbox_plan import prepare

CONFIG = OutboxConfig()
SECRET = "s3cr3t-value"


class Keyed(str):
    """A str whose equality is its identity (two equal texts, two dict keys)."""

    __hash__ = object.__hash__

    def __eq__(self, other: object) -> bool:
        return self is other


@pytest.mark.parametrize(
    ("payload", "where", "kinds"),
    [
        ({1: SECRET, "1": SECRET}, "payload (at the top level)", "int and str"),
        ({True: SECRET, "true": SECRET}, "payload (at the top level)", "bool and str"),
        ({None: SECRET, "null": SECRET}, "payload (at the top level)", "NoneType and str"),
        ({1.0: SECRET, "1.0": SECRET}, "payload (at the top level)", "float and str"),
        ({"a": [0, {"b": {2: SECRET, "2": SECRET}}]}, "payload['a'][1]['b']", "int and str"),
        ({"x" * 50: {-1: 0, "-1": 0}}, "payload[a str key, 50 characters]", "int and str"),
        (OrderedDict([(1, 0), ("1", 0)]), "payload (at the top level)", "int and str"),
        ({Keyed("k"): 0, Keyed("k"): 1}, "payload (at the top level)", "Keyed and Keyed"),
    ],
    ids=["int", "bool", "none", "float", "nested", "long_key", "ordered_dict", "str_subclass"],
)
def test_dict_payload_keys_written_alike_are_refused(payload: Any, where: str, kinds: str) -> None:
    with pytest.raises(SerializationError) as refused:
        prepare(Message("t", payload), CONFIG)
    text = str(refused.value)
    assert text.startswith(f"{where} has keys of types {kinds} that JSON writes as the same")
    assert SECRET not in text


@pytest.mark.parametrize(
    "payload",
    [
        {1: "a", 2: "b", "3": "c"},  # int keys: no two alike
        {1: "a", 1.5: "b", None: "c", False: "d"},  # no str key to meet
        {"a": {"b": [1, {"c": None}]}, "d": (1, 2)},
        {Keyed("k"): 0, "k2": 1},
    ],
)
def test_dict_payloads_without_such_keys_are_written_as_before(payload: Any) -> None:
    expected = json.dumps(payload, separators=(",", ":"), ensure_ascii=False)
    assert prepare(Message("t", payload), CONFIG).payload == expected.encode()


def test_header_names_written_alike_are_refused() -> None:
    headers = {Keyed("tenant"): SECRET, Keyed("tenant"): SECRET}
    with pytest.raises(SerializationError, match=r"^headers .* keys of types Keyed and Keyed"):
        prepare(Message("t", b"x", headers=headers), CONFIG)


class Kind(enum.StrEnum):
    TENANT = "tenant"


def test_header_names_of_a_str_enum_are_taken() -> None:
    row = prepare(Message("t", b"x", headers={Kind.TENANT: "a", "b": "c"}), CONFIG)
    assert json.loads(row.headers) == {"tenant": "a", "b": "c"}


class Anything(BaseModel):
    d: dict[Any, int]


class IntOrStr(Event, topic="t"):
    d: dict[int | str, int]


class Loose(BaseModel):
    x: Any


class Root(RootModel[dict[int | str, int]]):
    pass


class Serialised(BaseModel):
    n: int = 0

    @field_serializer("n")
    def spelled(self, n: int) -> dict[Any, int]:
        return {n: 0, str(n): 1}


class Computed(BaseModel):
    @computed_field  # type: ignore[prop-decorator]
    @property
    def d(self) -> dict[Any, int]:
        return {None: 0, "None": 1}


@pytest.mark.parametrize(
    ("model", "where"),
    [
        (Anything(d={1: 0, "1": 1}), "payload['d']"),
        (Anything(d={None: 0, "None": 1}), "payload['d']"),  # pydantic writes None as "None"
        (Anything(d={(1, 2): 0, "1,2": 1}), "payload['d']"),  # and a tuple joined with ","
        (IntOrStr(d={1: 0, "1": 1}), "IntOrStr['d']"),
        (Loose(x=[{"k": {True: 0, "true": 1}}]), "payload['x'][0]['k']"),
        (Root({1: 0, "1": 1}), "payload (at the top level)"),
        (Serialised(n=1), "payload['n']"),
        (Computed(), "payload['d']"),
    ],
    ids=["any", "none", "tuple", "int_or_str", "in_any", "root", "serializer", "computed"],
)
def test_model_keys_written_alike_are_refused(model: Any, where: str) -> None:
    item = model if isinstance(model, Event) else Message("t", model)
    with pytest.raises(SerializationError) as refused:
        prepare(item, CONFIG)
    assert str(refused.value).startswith(f"{where} has two keys written as the same object key")


@pytest.mark.parametrize(
    "model",
    [
        Anything(d={1: 0, 2: 1}),
        IntOrStr(d={1: 0, "2": 1}),
        Loose(x={"a": [1, {"b": None}]}),
        Root({1: 0, "2": 1}),
    ],
)
def test_models_without_such_keys_are_written_as_pydantic_writes_them(model: Any) -> None:
    item = model if isinstance(model, Event) else Message("t", model)
    assert prepare(item, CONFIG).payload == model.model_dump_json().encode()


class Typed(Event, topic="t"):
    name: str
    totals: dict[str, float]
    counts: dict[int, int]
    lines: list[Root] = Field(default_factory=list)


def test_fields_that_cannot_hold_such_keys_are_not_walked() -> None:
    """Scalars, and mappings whose keys pydantic validated as str or as int, cost nothing at a
    write (a field holding a model is walked only if that model's fields are)."""
    assert plan_of(Typed).fields == (("lines", False),)
    assert plan_of(Event) is NOTHING
    assert plan_of(RootModel[dict[str, int]]) is NOTHING


def test_a_key_of_another_type_put_in_after_validation_is_not_seen() -> None:
    """Documented: pydantic writes it with its own warning; not read back (docs/writes.md)."""
    event = Typed(name="n", totals={"1": 1.0}, counts={})
    event.totals[1] = 2.0  # type: ignore[index]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert prepare(event, CONFIG).payload.count(b'"1":') == 2
