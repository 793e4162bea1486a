"""The packed bigint[] parameter must be byte-for-byte what psycopg's own dumper sends."""

from __future__ import annotations

import pytest
from psycopg.adapt import PyFormat, Transformer
from psycopg.types.numeric import Int8

from outboxkit.db.id_arrays import BigintIds, pack_ids


@pytest.mark.parametrize(
    "ids",
    [[7], [1, 2, 3], list(range(10_000_000, 10_002_000)), [2**63 - 1, -(2**63), 0, -5]],
)
def test_packed_ids_are_psycopgs_binary_bigint_array(ids: list[int]) -> None:
    transformer = Transformer()
    typed = [Int8(i) for i in ids]  # psycopg would pick int2/int4 for small plain ints
    assert pack_ids(ids) == bytes(transformer.get_dumper(typed, PyFormat.BINARY).dump(typed))
    dumper = transformer.get_dumper(BigintIds(ids), PyFormat.BINARY)
    assert dumper.oid == 1016  # bigint[]
    assert dumper.dump(BigintIds(ids)) == pack_ids(ids)


def test_no_ids_is_an_empty_bigint_array() -> None:
    # ndim 0, no nulls, element type int8 (psycopg itself sends '{}' as text here).
    assert pack_ids([]) == b"\x00" * 8 + b"\x00\x00\x00\x14"
