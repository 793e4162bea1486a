"""Building frozen dataclasses on the per-event path, for less.

A frozen dataclass's generated ``__init__`` sets each field through ``object.__setattr__``: for
the objects a batch builds per event (envelope, identity, handler context, outcome) that is a
good part of the middleware's own time per event. :func:`build` fills the instance's ``__dict__``
in one update instead. The instance is the same (fields, equality, hash, repr, still frozen);
the caller passes every field (no defaults, no ``__post_init__``: the classes built here have
none), which ``tests/unit/test_inbox_frozen.py`` checks.
"""

from __future__ import annotations

from typing import Any, TypeVar

T = TypeVar("T")

_new = object.__new__


def build(cls: type[T], /, **fields: Any) -> T:
    """An instance of the frozen dataclass ``cls`` with exactly ``fields``."""
    obj: T = _new(cls)
    obj.__dict__.update(fields)
    return obj
