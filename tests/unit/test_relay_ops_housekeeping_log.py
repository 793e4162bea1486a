"""Housekeeping's log line names each state's own count, and only when rows went."""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import datetime
from typing import Any

import pytest

from outboxkit.relay.housekeeping import Housekeeping
from outboxkit.relay.lease import LeaseTerm
from outboxkit.settings import RelaySettings

pytestmark = pytest.mark.unit


async def test_each_state_logs_its_own_count(caplog: pytest.LogCaptureFixture) -> None:
    config = RelaySettings(discarded_retention_seconds=3600, parked_retention_seconds=7200)
    sweep = Housekeeping(config, "outboxkit")
    removed = {"discarded": 3, "parked": 0}

    async def delete_batch(
        conn: Any, term: LeaseTerm, state: str, keep: float, now: datetime | None
    ) -> int:
        found, removed[state] = removed[state], 0  # one short batch each
        return found

    sweep._delete_batch = delete_batch  # type: ignore[method-assign]
    term = LeaseTerm("default", 1, "me", 7, 15.0, time.monotonic() + 15)  # no stray parking
    with caplog.at_level(logging.INFO, logger="outboxkit.relay.housekeeping"):
        assert await sweep.run_if_due(object(), term, asyncio.Event()) == 3  # type: ignore[arg-type]
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["shard 1: housekeeping removed 3 discarded row(s) older than 3600.0s"]
