"""A rejoin in a group of two members, on the real stack, both drivers.

Member A's client refuses every seek back to its held record, so A rejoins with a new client;
that client cannot join at first (its subscribe is held back, as while Kafka is away). Member B,
of the same group, meanwhile owns the partition, runs the held record and those behind it, and
commits past them; it leaves, and A's new client gets the partition back. A's carried hold is
then stale: A drops it (the committed offset is past it) instead of reporting the held record
gone or running B's records again.
"""

from __future__ import annotations

import inspect
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from outboxkit.errors import PublishError
from outboxkit.inbox import InboxSettings, OutcomeKind, RetryPolicy
from outboxkit.inbox import gate as gate_module
from outboxkit.inbox.gate import SEEK_RETRY_SECONDS
from outboxkit.kafka import KafkaClients
from tests.integration.inbox_support import (
    EFFECT_DDL,
    REGISTRY,
    Behaviour,
    Harness,
    effects,
    inbox_row,
    inbox_state,
    produce_event,
)
from tests.integration.test_inbox_conformance import adapter  # noqa: F401
from tests.integration.test_inbox_seek_recovery import RefusedSeeks
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

TopicFactory = Callable[..., str]
BOUND = 90.0  # seconds within which each step of the scenario must have happened


class HeldBack(RefusedSeeks):
    """:class:`RefusedSeeks` whose client, once replaced, cannot join until ``let_join``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.let_join = threading.Event()
        self.replaced = threading.Event()  # the old client closed; a join was refused
        self.joined = threading.Event()  # the new client subscribed

    def _quicker(self, cls: Any) -> Any:
        harness = self

        class Gated(super()._quicker(cls)):  # type: ignore[misc]
            def _clients(self, clients: KafkaClients, group_id: str, config: Any) -> Any:
                consumer, sender = super()._clients(clients, group_id, config)
                consumer.subscribe = harness._gate(consumer.subscribe)
                return consumer, sender

        return Gated

    def _gate(self, subscribe: Any) -> Any:
        calls = [0]

        def refused() -> bool:
            calls[0] += 1
            if calls[0] == 1 or self.let_join.is_set():
                if calls[0] > 1:
                    self.joined.set()
                return False
            self.replaced.set()
            return True

        if inspect.iscoroutinefunction(subscribe):

            async def gated_async(*args: Any) -> None:
                if refused():
                    raise PublishError("Kafka consumer could not start: held back by the test")
                await subscribe(*args)

            return gated_async

        def gated(*args: Any) -> None:
            if refused():
                raise PublishError("Kafka consumer could not start: held back by the test")
            subscribe(*args)

        return gated


@pytest.fixture
def members(
    adapter: str,  # noqa: F811
    outboxkit_db_url: str,
    sa_url: str,
    outboxkit_kafka_bootstrap: str,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Callable[..., Harness]]:
    """``start(cls, topic, behaviour, group_id=None)``: a running member of consumer billing."""
    monkeypatch.setattr(gate_module, "SEEK_RETRY_SECONDS", SEEK_RETRY_SECONDS / 5)
    with psycopg.connect(outboxkit_db_url) as conn:
        conn.execute(EFFECT_DDL)
    running: list[Harness] = []
    settings = InboxSettings(
        consumer="billing", registry=REGISTRY, policy=RetryPolicy(initial_delay=0.1)
    )

    def start(
        cls: type[Harness], topic: str, behaviour: Behaviour, group_id: str | None = None
    ) -> Harness:
        harness = cls(
            adapter,
            sa_url=sa_url,
            bootstrap=outboxkit_kafka_bootstrap,
            topics=[topic],
            settings=settings,
            behaviour=behaviour,
            group_id=group_id,
        )
        running.append(harness)
        harness.start()
        return harness

    yield start
    for harness in running:
        if harness._thread.is_alive():
            harness.stop()


def test_a_hold_another_member_settled_during_the_rejoin_is_dropped(
    members: Callable[..., Harness],
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    topic = outboxkit_topic()
    before, held, *behind = (str(uuid.uuid4()) for _ in range(4))
    for n, event_id in enumerate([before, held, *behind]):
        produce_event(outboxkit_kafka_bootstrap, topic, event_id, f"o{n}", n)
    caplog.set_level("INFO", logger="outboxkit.inbox.consumer")
    a = members(HeldBack, topic, Behaviour(fail_attempts=1, fail_only=held))
    assert isinstance(a, HeldBack)
    wait_for(a.replaced.is_set, timeout=BOUND, what="member A replacing its client")
    b = members(Harness, topic, Behaviour(), group_id=a.group_id)
    for event_id in [held, *behind]:  # B starts at the held offset A committed
        wait_for(
            lambda e=event_id: inbox_state(outboxkit_db_url, e) == "succeeded",
            timeout=BOUND,
            what=f"{event_id} succeeded on member B",
        )
    b.wait_outcomes(held, *behind)
    b.stop()  # commits and leaves: A's new client gets the partition
    a.let_join.set()
    wait_for(a.joined.is_set, timeout=BOUND, what="member A's new client joining")
    after = str(uuid.uuid4())
    produce_event(outboxkit_kafka_bootstrap, topic, after, "o-after", 4)
    wait_for(
        lambda: inbox_state(outboxkit_db_url, after) == "succeeded", timeout=BOUND, what="after"
    )
    a.wait_outcomes(after)
    assert [e[0] for e in effects(outboxkit_db_url)] == [before, held, *behind, after]
    ran_on_a = [(o.event_id, o.kind) for o in list(a.outcomes)]
    assert ran_on_a == [
        (before, OutcomeKind.SUCCEEDED),
        (held, OutcomeKind.RETRY),
        (after, OutcomeKind.SUCCEEDED),  # nothing B settled ran again (no duplicate)
    ]
    assert [(o.event_id, o.kind) for o in b.outcomes] == [
        (e, OutcomeKind.SUCCEEDED) for e in [held, *behind]
    ]
    assert not [m for m in caplog.messages if "is gone" in m]  # the held record never left
    assert any(
        f"{topic}/0: another member committed offset 4 past held offset 1" in m
        for m in caplog.messages
    )
    row = inbox_row(outboxkit_db_url, "billing", held)
    assert row is not None
    assert (row["state"], row["attempts"]) == ("succeeded", 2)
