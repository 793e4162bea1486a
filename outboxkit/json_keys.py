"""Mapping keys that JSON would merge into one object key: refused, or a reader keeps one value.

JSON's object keys are text. The standard library's encoder writes the key ``1`` as ``"1"``,
``True`` as ``"true"``, ``None`` as ``"null"``, ``1.0`` as ``"1.0"``, so next to the str key of
the same text it writes the member twice, and every reader keeps only one of the two values.
A dict holds no two equal ``str``, so only a dict with a key that is not exactly a ``str`` can
do that: the check looks at each key's type (a payload of str-keyed dicts costs one walk in
Python, about a fifth of a microsecond for a small one) and spells the keys of such a dict only.
Only payloads the standard library encodes are checked: pydantic spells keys its own way and
its models are not walked (docs/writes.md).

Errors name the path (the types of the keys on it, list positions) and the colliding keys'
types, never a key or a value. A payload nested deeper than the walk goes (a few hundred
levels) is written unchecked, as before the check.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from outboxkit.errors import SerializationError


class _Merged(Exception):
    """Two keys of one dict written alike: unwound to the top, collecting the path."""

    def __init__(self, kinds: str) -> None:
        super().__init__(kinds)
        self.kinds = kinds
        self.path: list[str] = []  # innermost first


def _json_key(key: object) -> str:
    """The object key the standard library's encoder writes for ``key`` (as its C encoder
    does: a subclass of str, float or int as its plain value)."""
    if isinstance(key, str):
        return str.__str__(key)
    if isinstance(key, float):
        return float.__repr__(key)
    if key is True or key is False or key is None:
        return "true" if key is True else "false" if key is False else "null"
    if isinstance(key, int):
        return int.__repr__(key)
    raise TypeError(f"keys must be str, int, float, bool or None, not {type(key).__name__}")


def key_part(key: object) -> str:
    """A dict key on an error's path: its type only (a key may be data: an id, an address,
    a token)."""
    return f"[{type(key).__name__} key]"


def _spelled(mapping: Mapping[Any, Any]) -> None:
    """A dict with keys that are not all exactly str (or not a plain dict): its keys spelled as
    the encoder spells them, then its values walked."""
    items = list(mapping.items())  # as the encoder takes a dict subclass's items
    seen: dict[str, object] = {}
    for key, _ in items:
        text = _json_key(key)
        if text in seen:
            raise _Merged(f"keys of types {type(seen[text]).__name__} and {type(key).__name__}")
        seen[text] = key
    for key, value in items:
        if type(value) not in _LEAVES:
            try:
                _walk(value)
            except _Merged as merged:
                merged.path.append(key_part(key))
                raise


def _dict(mapping: dict[Any, Any]) -> None:
    """A plain dict: looped here while its keys are exactly str (the first other key hands it
    to _spelled); one Python call a level of nesting, as the C encoder's own recursion."""
    for key, value in mapping.items():
        if type(key) is not str:
            break
        kind = type(value)
        if kind in _LEAVES:
            continue
        try:
            if kind is dict:
                _dict(value)
            elif kind is list or kind is tuple:
                _sequence(value)
            else:
                _walk(value)
        except _Merged as merged:
            merged.path.append(key_part(key))
            raise
    else:
        return
    _spelled(mapping)


def _sequence(items: list[Any] | tuple[Any, ...]) -> None:
    for item in items:
        kind = type(item)
        if kind in _LEAVES:
            continue
        try:
            if kind is dict:
                _dict(item)
            elif kind is list or kind is tuple:
                _sequence(item)
            else:
                _walk(item)
        except _Merged as merged:
            merged.path.append(f"[{next(i for i, x in enumerate(items) if x is item)}]")
            raise


def _walk(value: object) -> None:
    if type(value) is dict:
        _dict(value)
    elif isinstance(value, dict):
        _spelled(value)
    elif isinstance(value, list | tuple):
        _sequence(value)


_LEAVES = frozenset({str, int, float, bool, type(None)})


def check_json_keys(value: object, what: str = "payload") -> None:
    """Raise SerializationError if the JSON of ``value`` (dicts, lists and scalars, as the
    standard library's encoder just wrote it) would hold one key twice in an object."""
    if type(value) is dict:
        for key, item in value.items():
            if type(key) is not str or type(item) not in _LEAVES:
                break
        else:
            return  # the usual payload: flat, str keys
    try:
        _walk(value)
    except _Merged as merged:
        place = what + ("".join(reversed(merged.path)) or " (at the top level)")
        raise SerializationError(
            f"{place} has {merged.kinds} that JSON writes as the same object key: a reader"
            " would keep only one of their values, so it is not written (make the keys"
            " distinct as text)"
        ) from None
    except RecursionError:
        # Deeper than this walk goes (a few hundred levels; the encoder took it): written as
        # before the check existed, unchecked.
        return
