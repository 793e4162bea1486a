"""Run a child process without one Kafka client library (see ``blocked_imports/``)."""

from __future__ import annotations

import os
from pathlib import Path

BLOCKED_IMPORTS_DIR = Path(__file__).resolve().parent / "blocked_imports"


def env_without(*modules: str, base: dict[str, str] | None = None) -> dict[str, str]:
    """An environment in which ``modules`` (e.g. ``confluent_kafka``) cannot be imported."""
    env = dict(os.environ if base is None else base)
    env["OUTBOXKIT_TEST_BLOCK_IMPORTS"] = ",".join(modules)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(BLOCKED_IMPORTS_DIR), env.get("PYTHONPATH", "")) if p
    )
    return env
