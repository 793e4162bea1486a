"""The collector settings of outboxkit's own processes (``relay run``, ``inbox run``)."""

from __future__ import annotations

import gc
import subprocess
import sys
from collections.abc import Iterator

import pytest

from outboxkit.gc_tuning import MIDDLE, OLD, YOUNG, tune_gc

pytestmark = pytest.mark.unit


@pytest.fixture
def restored_gc() -> Iterator[None]:
    before = gc.get_threshold()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


@pytest.mark.usefixtures("restored_gc")
def test_tune_gc_collects_less_often_and_skips_what_start_up_loaded() -> None:
    gc.unfreeze()
    tune_gc()
    assert gc.get_threshold() == (YOUNG, MIDDLE, OLD)
    assert YOUNG > 700 * 10  # far above CPython's default young threshold
    assert gc.get_freeze_count() > 1000  # modules, classes and functions loaded so far


def _collector_after(imports: str) -> str:
    code = f"import gc{imports}; print(*gc.get_threshold(), gc.get_freeze_count())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return out.stdout


def test_importing_outboxkit_leaves_the_host_processs_collector_alone() -> None:
    """An application embedding the relay or the middleware keeps its own settings."""
    ours = ", outboxkit.cli.relay, outboxkit.cli.inbox, outboxkit.inbox, outboxkit.outbox"
    assert _collector_after(ours) == _collector_after("")
