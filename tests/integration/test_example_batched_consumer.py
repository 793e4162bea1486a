"""examples/06_batched_consumer runs against the real services and does what its README says."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import sqlalchemy as sa

from outboxkit.db import sqlalchemy_url

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "06_batched_consumer" / "main.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("examples_06_batched_consumer", EXAMPLE)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_batched_consumer_example(outboxkit_db_url: str, outboxkit_kafka_bootstrap: str) -> None:
    example = _load()
    states = example.main(outboxkit_db_url, outboxkit_kafka_bootstrap, count=12)
    assert states == {"succeeded": 11, "dead": 1}
    engine = sa.create_engine(sqlalchemy_url(outboxkit_db_url))
    try:
        shipped = example.shipments(engine)
    finally:
        engine.dispose()
    assert len(shipped) == 11  # the dead order's writes were rolled back, every attempt
    assert set(shipped.values()) == {1}
