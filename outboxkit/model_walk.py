"""What a pydantic model's JSON could lose that no serializer setting refuses.

- A model reached only through ``Any`` (a field, ``dict[str, Any]``'s values, ``SerializeAsAny``,
  the extra fields of ``extra="allow"``) is written by its own serializer, whatever the outer
  one's settings: a NaN in it became ``null``.
- pydantic spells a mapping's keys as text its own way (``1`` as ``"1"``, ``None`` as
  ``"None"``, a tuple as ``"1,2"``), so two keys can become one object key
  (``{1: .., "1": ..}`` in a ``dict[int | str, ...]`` or an ``Any``), and a reader keeps one
  of the values.

Neither shows in the bytes cheaply. So a class's fields are sorted once, from its core schema:
those that can hold neither a mapping nor an ``Any`` (most fields) cost nothing at a write; the
others' values are walked. A model met where no type was declared is checked as a payload of its
own (``check``); a mapping whose keys are not all exactly ``str`` (or all exactly ``int``) has
the whole JSON read back for a key written twice (:func:`outboxkit.json_keys.merged_in`). A class
whose output is not its data (a serializer function without a return type, or one returning a
mapping or ``Any``; a computed field returning one) is read back at every write.

Not seen: models inside a generator or iterator (pydantic consumes it; walking would too), or
inside what a serializer function or a computed field returns; a key of another type put into a
``dict[str, ...]`` or ``dict[int, ...]`` after validation (pydantic warns as it writes it):
walking every such mapping at every write would tax the common event for a misuse pydantic
already reports.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

PLAN_ATTRIBUTE = "__outboxkit_walk__"  # on the class itself, as its serializer (events.py)
_WALK, _LOOSE, _OPAQUE = 1, 2, 4
# Keys of a core schema node that hold no schema (values, functions, settings).
_NOT_SCHEMAS = frozenset(
    {"serialization", "metadata", "config", "default", "expected", "cls", "ref", "schema_ref",
     "function", "discriminator", "pattern", "post_init", "cls_repr", "custom_error_context"}
)  # fmt: skip
_LEAVES = frozenset({str, int, float, bool, type(None), bytes})

Check = Callable[[Any], None]


class Plan(NamedTuple):
    """Which fields of a class to walk at a write: ``(name, loose)`` (``loose``: no type is
    declared for what it holds), ``extra`` (the extra fields, loose), ``opaque`` (read the
    JSON back at every write)."""

    fields: tuple[tuple[str, bool], ...]
    extra: bool
    opaque: bool


NOTHING = Plan((), False, False)
_OPAQUE_PLAN = Plan((), False, True)


def _flags(node: Any, refs: dict[str, Any], seen: frozenset[str], nested: bool) -> int:
    """What a schema can hold: a mapping (walk), an Any (loose), output that is not its data
    (opaque). Inside another model's schema its own plan decides: that part is only walked."""
    if isinstance(node, list | tuple):
        return _any_flags(node, refs, seen, nested)
    if not isinstance(node, dict):
        return 0
    kind = node.get("type")
    if not isinstance(kind, str):  # a mapping of schemas (fields, tagged-union choices)
        return _any_flags(node.values(), refs, seen, nested)
    inside = nested or kind in ("model", "dataclass")
    flags = _serialization_flags(node.get("serialization"), refs, seen, inside)
    if kind in ("any", "is-instance", "typed-dict"):
        flags |= _WALK | _LOOSE
    elif kind == "dict" and not _validated_keys(node.get("keys_schema")):
        flags |= _WALK
    elif kind == "definition-ref":
        ref = node.get("schema_ref")
        if isinstance(ref, str) and ref not in seen:
            flags |= _flags(refs.get(ref), refs, seen | {ref}, nested)
        return flags
    children = (child for key, child in node.items() if key not in _NOT_SCHEMAS)
    flags |= _any_flags(children, refs, seen, inside)
    if kind in ("model", "dataclass") and flags:
        return _WALK  # its instances are walked by their own class's plan
    return flags


def _validated_keys(keys: Any) -> bool:
    """Keys validated as str, or as int, and written as they are: no two spelled alike. (One
    put in after validation, of another type, is written with pydantic's warning; not seen.)"""
    return (
        isinstance(keys, dict)
        and keys.get("type") in ("str", "int")
        and "serialization" not in keys
    )


def _any_flags(nodes: Any, refs: dict[str, Any], seen: frozenset[str], nested: bool) -> int:
    flags = 0
    for child in nodes:
        flags |= _flags(child, refs, seen, nested)
    return flags


def _serialization_flags(
    serialization: Any, refs: dict[str, Any], seen: frozenset[str], nested: bool
) -> int:
    if not isinstance(serialization, dict):
        return 0
    kind = serialization.get("type")
    if kind == "any":  # SerializeAsAny: the value's own class writes it
        return _WALK | _LOOSE
    if kind in ("function-plain", "function-wrap"):
        returned = serialization.get("return_schema")
        if returned is None or _flags(returned, refs, seen, nested):
            return _WALK if nested else _OPAQUE
    return 0


def _refs(node: Any, found: dict[str, Any]) -> dict[str, Any]:
    """Every schema with a ``ref`` (the targets of ``definition-ref``)."""
    if isinstance(node, list | tuple):
        for child in node:
            _refs(child, found)
    elif isinstance(node, dict):
        if isinstance(node.get("ref"), str) and "type" in node:
            found.setdefault(node["ref"], node)
        for key, child in node.items():
            if key not in ("metadata", "cls", "default", "expected"):
                _refs(child, found)
    return found


def _planned(cls: type) -> Plan:
    schema = getattr(cls, "__pydantic_core_schema__", None)
    refs = _refs(schema, {})
    kinds = ("model", "dataclass")
    candidates = [schema, *refs.values()] if isinstance(schema, dict) else []
    own = next((n for n in candidates if n.get("type") in kinds and n.get("cls") is cls), None)
    if own is None or _serialization_flags(own.get("serialization"), refs, frozenset(), False):
        return _OPAQUE_PLAN  # a model_serializer, or a schema of its own making
    inner = own.get("schema")
    if own.get("root_model"):
        flags = _flags(inner, refs, frozenset(), False)
        if flags & _OPAQUE:
            return _OPAQUE_PLAN
        return Plan((("root", bool(flags & _LOOSE)),), False, False) if flags else NOTHING
    if not isinstance(inner, dict) or inner.get("type") not in ("model-fields", "dataclass-args"):
        return _OPAQUE_PLAN
    fields = inner.get("fields") or ()
    pairs = fields.items() if isinstance(fields, dict) else ((f["name"], f) for f in fields)
    named = []
    for name, field in pairs:
        if field.get("serialization_exclude") is True:
            continue  # never written: nothing of it to refuse
        flags = _flags(field, refs, frozenset(), False)
        if flags & _OPAQUE:
            return _OPAQUE_PLAN
        if flags:
            named.append((name, bool(flags & _LOOSE)))
    for computed in inner.get("computed_fields") or ():
        if _flags(computed.get("return_schema"), refs, frozenset(), False):
            return _OPAQUE_PLAN  # a property: its value is not read twice
    config = own.get("config") or {}
    extra = config.get("extra_fields_behavior") == "allow" and own.get("type") == "model"
    return Plan(tuple(named), extra, False) if named or extra else NOTHING


def plan_of(cls: type) -> Plan:
    """The class's plan, made once (when pydantic has completed the class)."""
    plan: Plan | None = cls.__dict__.get(PLAN_ATTRIBUTE)
    if plan is None:
        plan = _planned(cls)
        if getattr(cls, "__pydantic_complete__", False):
            type.__setattr__(cls, PLAN_ATTRIBUTE, plan)
    return plan


def _walk(value: Any, loose: bool, check: Check) -> bool:
    """Walk ``value``; True if it holds a mapping whose keys could be spelled alike (keys all
    exactly str, or all exactly int, cannot). A plain dict or list is looped here (most data)."""
    kind = type(value)
    if kind is dict:
        odd = suspect = False
        for key, item in value.items():
            if type(key) is not str:
                odd = True
            if type(item) not in _LEAVES and _walk(item, loose, check):
                suspect = True
        return suspect or (odd and not all(type(key) is int for key in value))
    if kind is list:
        suspect = False
        for item in value:
            if type(item) not in _LEAVES and _walk(item, loose, check):
                suspect = True
        return suspect
    return _other(value, kind, loose, check)


def _other(value: Any, kind: type, loose: bool, check: Check) -> bool:
    """The rarer data: other sequences, a dict subclass, a model, a dataclass, an iterator."""
    if isinstance(value, list | tuple | set | frozenset):
        suspect = False
        for item in value:
            if type(item) not in _LEAVES and _walk(item, loose, check):
                suspect = True
        return suspect
    if isinstance(value, dict):  # a subclass: its items may be its own
        for item in value.values():
            _walk(item, loose, check)
        return True
    if hasattr(kind, "__pydantic_serializer__"):
        if loose:
            check(value)  # written by its own serializer: checked as a payload of its own
            return False
        return walk_model(value, plan_of(kind), check)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        suspect = False  # every field walked: a model anywhere in them is checked
        for field in dataclasses.fields(value):
            suspect = _walk(getattr(value, field.name), True, check) or suspect
        return suspect
    return isinstance(value, Iterator)  # consumed by pydantic: read its JSON back instead


def walk_model(model: Any, plan: Plan, check: Check) -> bool:
    """Walk a model's fields that its plan names; True if its JSON must be read back for a key
    written twice. A model met where no type was declared is given to ``check``."""
    if plan.opaque:
        return True
    suspect = False
    for name, loose in plan.fields:
        value = getattr(model, name, None)
        if type(value) not in _LEAVES and _walk(value, loose, check):
            suspect = True
    extra = getattr(model, "__pydantic_extra__", None) if plan.extra else None
    for value in (extra or {}).values():
        if type(value) not in _LEAVES and _walk(value, True, check):
            suspect = True
    return suspect
