"""Record batches with header names that are not UTF-8, which no client will produce.

A name is written as a placeholder of its length, then swapped into the built batch bytes,
whose CRC-32C (over the bytes after offset 21) is computed again.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any


class RawNames:
    """Collects the swaps of one batch."""

    def __init__(self) -> None:
        self.swaps: dict[bytes, bytes] = {}

    def headers(self, headers: Sequence[tuple[str | bytes, bytes | None]]) -> list[Any]:
        """The headers with each bytes name replaced by a placeholder (a str)."""
        named: list[Any] = []
        for name, value in headers:
            if isinstance(name, bytes):
                placeholder = "\x7f" * (len(name) - 1) + chr(0x61 + len(self.swaps))
                self.swaps[placeholder.encode()] = name
                name = placeholder
            named.append((name, value))
        return named

    def patch(self, built: bytes) -> bytes:
        """The built batch with the real names in, and its CRC fixed."""
        from aiokafka.record.util import calc_crc32c

        data = bytes(built)
        for placeholder, name in self.swaps.items():
            assert data.count(placeholder) == 1, "placeholder not unique in the batch"
            data = data.replace(placeholder, name)
        return data[:17] + struct.pack(">I", calc_crc32c(data[21:])) + data[21:]
