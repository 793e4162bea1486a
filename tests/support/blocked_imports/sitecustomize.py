"""Make Kafka client libraries unimportable in a child process, as if their extra were missing.

Put this folder first on PYTHONPATH and name the top-level modules in
``OUTBOXKIT_TEST_BLOCK_IMPORTS`` (comma-separated), e.g. ``confluent_kafka``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType

_BLOCKED = {n for n in os.environ.get("OUTBOXKIT_TEST_BLOCK_IMPORTS", "").split(",") if n}


class _Blocker:
    def find_spec(
        self, name: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if name.partition(".")[0] in _BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


if _BLOCKED:
    sys.meta_path.insert(0, _Blocker())
