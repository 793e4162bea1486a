"""Keys that JSON would write as one object key (``{1: .., "1": ..}``): refused, for a reader
keeps only one of the values. Raw dict payloads (the standard library's spelling) and headers.
The errors name the path and the keys' types, never the keys or the values."""

from __future__ import annotations

import enum
import json
from collections import OrderedDict
from typing import Any

import pytest

from outboxkit.errors import SerializationError
from outboxkit.events import Message
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
        (
            {"a": [0, {"b": {2: SECRET, "2": SECRET}}]},
            "payload[str key][1][str key]",
            "int and str",
        ),
        ({SECRET: {-1: 0, "-1": 0}}, "payload[str key]", "int and str"),
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


def test_a_payload_deeper_than_the_walk_is_written_unchecked_as_before() -> None:
    payload: Any = {1: "x"}
    for _ in range(900):  # the encoder takes it; the walk gives up (RecursionError)
        payload = {1: payload}
    assert prepare(Message("t", payload), CONFIG).payload.startswith(b'{"1":{"1":')
