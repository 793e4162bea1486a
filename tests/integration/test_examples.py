"""The examples in examples/ run against the real services and do what they say."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"examples_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


async def test_async_payments(outboxkit_db_url: str, outboxkit_kafka_bootstrap: str) -> None:
    example = _load("async_payments")
    receipts = await example.main(outboxkit_db_url, outboxkit_kafka_bootstrap, count=8)
    assert receipts == {f"pay-{n}": 1 for n in range(8)}
