"""A payload whose validation raises something pydantic does not wrap (a validator's
``TypeError``) is that record's rejection, not a failure of its batch: on the real stack, over
both drivers, the other records of the batch succeed at their first attempt, even with
``max_attempts=1`` (a failed batch used to leave their claims spent, so each came back as a
takeover and went dead without its handler having run)."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pydantic
import pytest

from outboxkit.inbox import EventRegistry, OutcomeKind, RetryPolicy
from tests.integration.inbox_support import (
    EVENT_TYPE,
    Harness,
    effects,
    inbox_row,
    produce_event,
)
from tests.integration.test_inbox_conformance import adapter, start

pytestmark = pytest.mark.integration
__all__ = ["adapter", "start"]  # the conformance suite's fixtures: both drivers

Start = Callable[..., Harness]
TopicFactory = Callable[..., str]
POISON_AMOUNT = 13


class Picky(pydantic.BaseModel):
    order_id: str
    amount: int

    @pydantic.field_validator("amount")
    @classmethod
    def _not_unlucky(cls, value: int) -> int:
        if value == POISON_AMOUNT:
            raise TypeError("unlucky amount")  # pydantic wraps only ValueError, AssertionError
        return value


def test_a_validator_raising_a_type_error_rejects_its_record_and_the_batch_succeeds(
    start: Start,
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
) -> None:
    topic = outboxkit_topic()
    ok1, poison, ok2 = (str(uuid.uuid4()) for _ in range(3))
    for event_id, amount in [(ok1, 1), (poison, POISON_AMOUNT), (ok2, 2)]:
        produce_event(outboxkit_kafka_bootstrap, topic, event_id, f"o-{event_id[:4]}", amount)
    registry = EventRegistry()
    registry.register(Picky, event_type=EVENT_TYPE)
    harness = start(
        [topic],
        registry=registry,
        policy=RetryPolicy(max_attempts=1),
        consumer_options={"batch_max_ms": 300.0},  # the three records in one batch
    )
    harness.wait_outcomes(ok1, poison, ok2)
    kinds = {o.event_id: o.kind for o in harness.outcomes}
    assert kinds == {
        ok1: OutcomeKind.SUCCEEDED,
        poison: OutcomeKind.REJECTED,
        ok2: OutcomeKind.SUCCEEDED,
    }
    for event_id in (ok1, ok2):
        row = inbox_row(outboxkit_db_url, "billing", event_id)
        assert row is not None
        assert (row["state"], row["attempts"]) == ("succeeded", 1)
    row = inbox_row(outboxkit_db_url, "billing", poison)
    assert row is not None
    assert (row["state"], row["attempts"]) == ("rejected", 1)
    assert row["last_error"] == (
        f"payload of {EVENT_TYPE!r} could not be decoded: TypeError: unlucky amount"
    )
    assert sorted(e[0] for e in effects(outboxkit_db_url)) == sorted([ok1, ok2])
    reruns = harness.metrics.registry.get_sample_value(
        "outboxkit_inbox_batch_reruns_total", {"consumer": "billing", "reason": "one_by_one"}
    )
    assert reruns is None  # the batch did not fail as a whole
