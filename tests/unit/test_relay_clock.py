"""Every time-dependent decision of the relay's SQL takes the clock as ``:now`` (NULL in
production: the database clock), so tests decide "later" or "earlier" without waiting. Recorded
timestamps (``published_at = now()`` and the like) are facts, not decisions: they stay on the
database clock."""

from __future__ import annotations

import re

import pytest

from outboxkit.db import queries

pytestmark = pytest.mark.unit

INJECTABLE = "coalesce(CAST(:now AS timestamptz), now())"
# The database clock compared with, or counted from: a decision (or a measured age). An
# assignment (`SET published_at = now()`) records a fact and is not matched.
CLOCK = (
    r"(?:now\(\)|current_timestamp|localtimestamp|(?:clock|statement|transaction)_timestamp\(\))"
)
DECIDES = re.compile(
    rf"(?:[<>]=?|\bAND|\bBETWEEN)\s*{CLOCK}|{CLOCK}\s*(?:[-+<>]|\bAND)", re.IGNORECASE
)
# Operator read-outs (`relay status`, the sampler's holders and gauges), no write depends on
# them; their parameters are pinned by the status command and its plan tests.
READ_OUTS = {"holders", "status"}


def test_relay_decisions_take_the_injectable_clock() -> None:
    # Read-outs by name only while they are the statements of the holders fragment.
    assert {
        n for n, q in queries("relay", "outboxkit").items() if "holders AS" in q.text
    } == READ_OUTS
    bare = {
        name: found
        for name, q in queries("relay", "outboxkit").items()
        if name not in READ_OUTS and (found := DECIDES.findall(q.text.replace(INJECTABLE, "")))
    }
    assert bare == {}
