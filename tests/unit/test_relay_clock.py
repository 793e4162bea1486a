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


def test_relay_decisions_take_the_injectable_clock() -> None:
    # The operator read-outs too (`relay status`, the sampler's holders and gauges): a test
    # checks lease activity and pending age at a given time.
    bare = {
        name: found
        for name, q in queries("relay", "outboxkit").items()
        if (found := DECIDES.findall(q.text.replace(INJECTABLE, "")))
    }
    assert bare == {}
