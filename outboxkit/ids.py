"""Time-ordered event ids (UUIDv7, RFC 9562), because Python 3.11's ``uuid`` has no ``uuid7``.

Time-ordered ids keep the outbox's unique index on ``event_id`` append-mostly (random UUIDv4s
scatter inserts across the whole B-tree) and let a reader sort events by creation time.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from typing import Any

_lock = threading.Lock()
_last_ms = 0
_counter = 0
_COUNTER_MAX = 0xFFF  # 12 bits of rand_a used as a sub-millisecond counter (RFC 9562, method 1)


_POOL_BYTES = 4_000  # os.urandom once per 400 ids instead of one system call per id
_pool = b""
_pool_pos = 0


def _drop_pool() -> None:
    """A forked child must not hand out the random bits its parent also uses."""
    global _pool, _pool_pos
    _pool, _pool_pos = b"", 0


os.register_at_fork(after_in_child=_drop_pool)


def uuid7(
    _time_ns: Any = time.time_ns,
    _from_bytes: Any = int.from_bytes,
) -> uuid.UUID:
    """A UUIDv7: 48-bit Unix milliseconds, then a counter, then 62 random bits.

    Ids from one process are strictly increasing, even within one millisecond and when the
    wall clock steps back (the last timestamp is reused and the counter carries on).
    """
    global _last_ms, _counter, _pool, _pool_pos
    with _lock:
        pos = _pool_pos
        if pos + 10 > len(_pool):
            _pool, pos = os.urandom(_POOL_BYTES), 0
        # 62 bits for rand_b, 9 for a fresh counter
        random_bits = _from_bytes(_pool[pos : pos + 10], "big")
        _pool_pos = pos + 10
        now_ms = _time_ns() // 1_000_000
        if now_ms > _last_ms:
            _last_ms = now_ms
            _counter = (random_bits >> 62) & 0x1FF  # random start, room to grow
        else:
            _counter += 1
            if _counter > _COUNTER_MAX:
                _last_ms += 1
                _counter = 0
        ms, counter = _last_ms, _counter
    # version 7 and variant 0b10 are constant bits; the rest: time, counter, rand_b
    return _from_int(
        ((ms & _MS_MASK) << 80) | (counter << 64) | (random_bits & _RAND_B_MASK) | _VERSION_VARIANT
    )


def uuid7_batch(
    count: int,
    _time_ns: Any = time.time_ns,
    _from_bytes: Any = int.from_bytes,
    _new: Any = object.__new__,
    _set: Any = object.__setattr__,
    _unknown: uuid.SafeUUID = uuid.SafeUUID.unknown,
) -> list[uuid.UUID]:
    """``count`` UUIDv7s, as ``count`` calls of :func:`uuid7` would make them (strictly
    increasing, the same layout), for a fraction of the cost: one lock, one clock read and one
    slice of the random pool for the lot (``add_many`` needs one per row)."""
    global _last_ms, _counter, _pool, _pool_pos
    if count <= 0:
        return []
    need = 8 * count + 2  # 62 random bits per id, and 9 for a fresh counter
    with _lock:
        pos = _pool_pos
        if pos + need > len(_pool):
            _pool, pos = os.urandom(max(_POOL_BYTES, need)), 0
        random_bytes = _pool[pos : pos + need]
        _pool_pos = pos + need
        now_ms = _time_ns() // 1_000_000
        if now_ms > _last_ms:
            _last_ms = now_ms
            _counter = _from_bytes(random_bytes[-2:], "big") & 0x1FF
        else:
            _counter += 1
        ms, first = _last_ms, _counter
        # the counter runs on through the lot, into the next milliseconds when it overflows
        last = first + count - 1
        _last_ms, _counter = ms + (last >> 12), last & _COUNTER_MAX
    ids = []
    for offset, value in zip(range(0, need - 2, 8), range(first, last + 1), strict=True):
        made = _new(uuid.UUID)
        _set(
            made,
            "int",
            (((ms + (value >> 12)) & _MS_MASK) << 80)
            | ((value & _COUNTER_MAX) << 64)
            | (_from_bytes(random_bytes[offset : offset + 8], "big") & _RAND_B_MASK)
            | _VERSION_VARIANT,
        )
        _set(made, "is_safe", _unknown)
        ids.append(made)
    return ids


_MS_MASK = (1 << 48) - 1
_RAND_B_MASK = (1 << 62) - 1
_VERSION_VARIANT = (0x7 << 76) | (0b10 << 62)


def _from_int(
    value: int,
    _new: Any = object.__new__,
    _set: Any = object.__setattr__,
    _unknown: uuid.SafeUUID = uuid.SafeUUID.unknown,
) -> uuid.UUID:
    """``uuid.UUID(int=value)`` for a value known to be a valid 128-bit UUIDv7, without the
    constructor's argument parsing (a third of the cost of an id). Equal, hashed and printed
    exactly as the constructor's result: ``UUID`` keeps only ``int`` and ``is_safe``."""
    made = _new(uuid.UUID)
    _set(made, "int", value)
    _set(made, "is_safe", _unknown)
    result: uuid.UUID = made
    return result


def uuid_text(value: uuid.UUID) -> str:
    """``str(value)`` (the writer needs it for every default key)."""
    h = f"{value.int:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def uuid7_time_ms(value: uuid.UUID) -> int:
    """The Unix milliseconds embedded in a UUIDv7."""
    return value.int >> 80
