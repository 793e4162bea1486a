"""Row ids as one ``bigint[]`` parameter, packed in a few C calls.

psycopg's binary list dumper works element by element in Python (about 0.85 us an id on the
development machine); the relay sends every row's id at least twice (the in-flight list of the
next claim, then the mark), so on a backlog drain that was a visible share of its CPU. A bigint
array's binary layout is fixed-width, so the whole array is one ``struct.pack`` and strided copies.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import psycopg
from psycopg import pq
from psycopg.adapt import Dumper

_INT8_OID = 20
_INT8_ARRAY_OID = 1016
_EMPTY = struct.pack(">iiI", 0, 0, _INT8_OID)  # no dimensions, no nulls, element type
_HEADER = struct.Struct(">iiIii")  # one dimension, no nulls, element type, length, lower bound


class BigintIds(list[int]):
    """Row ids for a ``bigint[]`` parameter of a binary query (see :func:`pack_ids`)."""


def pack_ids(ids: Sequence[int]) -> bytes:
    """PostgreSQL's binary ``bigint[]``: per element a 4-byte length (8) and the value."""
    n = len(ids)
    if not n:
        return _EMPTY
    values = struct.pack(f">{n}q", *ids)
    out = bytearray(_HEADER.size + 12 * n)
    _HEADER.pack_into(out, 0, 1, 0, _INT8_OID, n, 1)
    start = _HEADER.size
    out[start + 3 :: 12] = b"\x08" * n
    for byte in range(8):
        out[start + 4 + byte :: 12] = values[byte::8]
    return bytes(out)


class _BigintIdsDumper(Dumper):
    format = pq.Format.BINARY
    oid = _INT8_ARRAY_OID

    def dump(self, obj: BigintIds) -> bytes:
        return pack_ids(obj)


psycopg.adapters.register_dumper(BigintIds, _BigintIdsDumper)
