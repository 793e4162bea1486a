"""A client that never accepts the seek back to a held record, on the real stack, both drivers.

The seam's ``seek`` of the consumer is wrapped to say it did not take effect, every time (the
fault). Retrying it kept the partition paused for ever; after the bound the consumer rejoins its
group with a new client, which starts from the committed offset: the held record runs again, once,
and the records behind it follow, each effect once.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient  # type: ignore[attr-defined]

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
    fetch,
    inbox_row,
    inbox_state,
    produce_event,
)
from tests.integration.test_inbox_conformance import adapter  # noqa: F401
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

TopicFactory = Callable[..., str]
BOUND = 60.0  # seconds within which the held record and those behind it must have run


class RefusedSeeks(Harness):
    """A :class:`Harness` whose consumer's seam refuses every seek (and counts them)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.refused: list[tuple[tuple[str, int], int]] = []

    def _quicker(self, cls: Any) -> Any:
        refused = self.refused

        def seek(partition: tuple[str, int], offset: int) -> bool:
            refused.append((partition, offset))
            return False

        class Refusing(super()._quicker(cls)):  # type: ignore[misc]
            def _clients(self, clients: KafkaClients, group_id: str, config: Any) -> Any:
                consumer, sender = super()._clients(clients, group_id, config)
                consumer.seek = seek  # the same seam object serves the new client too
                return consumer, sender

        return Refusing


@pytest.fixture
def refusing(
    adapter: str,  # noqa: F811
    outboxkit_db_url: str,
    sa_url: str,
    outboxkit_kafka_bootstrap: str,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Callable[..., RefusedSeeks]]:
    monkeypatch.setattr(gate_module, "SEEK_RETRY_SECONDS", SEEK_RETRY_SECONDS / 5)
    with psycopg.connect(outboxkit_db_url) as conn:
        conn.execute(EFFECT_DDL)
    running: list[RefusedSeeks] = []

    def start(
        topic: str, behaviour: Behaviour, policy: RetryPolicy | None = None, **options: Any
    ) -> RefusedSeeks:
        policy = policy or RetryPolicy(initial_delay=0.1)
        settings = InboxSettings(consumer="billing", registry=REGISTRY, policy=policy)
        harness = RefusedSeeks(
            adapter,
            sa_url=sa_url,
            bootstrap=outboxkit_kafka_bootstrap,
            topics=[topic],
            settings=settings,
            behaviour=behaviour,
            **options,
        )
        running.append(harness)
        harness.start()
        return harness

    yield start
    for harness in running:
        harness.stop()


def test_a_held_record_whose_seek_back_is_always_refused_runs_again_on_a_new_client(
    refusing: Callable[..., RefusedSeeks],
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    topic = outboxkit_topic()
    before, held, *behind = (str(uuid.uuid4()) for _ in range(4))
    ids = [before, held, *behind]
    for n, event_id in enumerate(ids):
        produce_event(outboxkit_kafka_bootstrap, topic, event_id, f"o{n}", n)
    caplog.set_level("WARNING", logger="outboxkit.inbox.consumer")
    harness = refusing(topic, Behaviour(fail_attempts=1, fail_only=held))
    for event_id in ids:  # the old consumer kept the partition paused: this timed out
        wait_for(
            lambda e=event_id: inbox_state(outboxkit_db_url, e) == "succeeded",
            timeout=BOUND,
            what=f"{event_id} succeeded",
        )
    harness.wait_outcomes(*ids)
    assert len(harness.refused) > gate_module.SEEK_ATTEMPTS  # more than the bound: all refused
    assert {where for where, _ in harness.refused} == {(topic, 0)}
    assert {offset for _, offset in harness.refused} == {1}  # only ever back to the held one
    row = inbox_row(outboxkit_db_url, "billing", held)
    assert row is not None
    assert row["attempts"] == 2  # the failed run, then the new client's
    assert [e[0] for e in effects(outboxkit_db_url)] == ids  # each effect once, in order
    kinds = {e: [o.kind for o in harness.outcomes if o.event_id == e] for e in ids}
    assert kinds[held] == [OutcomeKind.RETRY, OutcomeKind.SUCCEEDED]
    assert all(kinds[e] == [OutcomeKind.SUCCEEDED] for e in (before, *behind))
    assert any(
        f"{topic}/0: could not seek back to held offset 1" in m and "rejoining the group" in m
        for m in caplog.messages
    )
    stuck = fetch(
        outboxkit_db_url, "SELECT event_id FROM outboxkit.inbox_message WHERE state <> 'succeeded'"
    )
    assert stuck == []


LATEST = {"confluent": {"auto.offset.reset": "latest"}, "aiokafka": {"auto_offset_reset": "latest"}}


def test_a_held_first_record_is_not_skipped_by_the_rejoin_with_auto_offset_reset_latest(
    refusing: Callable[..., RefusedSeeks],
    adapter: str,  # noqa: F811
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
) -> None:
    """Nothing committed yet for the held record's partition (the first record the group
    consumed there): the rejoin commits the held offset, else the new member would start at
    the log's end (``latest``), past the held record and those behind it (stuck processing)."""
    topic = outboxkit_topic(partitions=2)
    held, *behind = (str(uuid.uuid4()) for _ in range(3))
    harness = refusing(
        topic,
        Behaviour(fail_attempts=1, fail_only=held),
        consumer_options={"config": LATEST[adapter]},
    )
    probes: list[str] = []

    def consuming() -> bool:
        """Whether the member fetches (a probe on partition 1 ran; produced until one does)."""
        if any(inbox_state(outboxkit_db_url, p) == "succeeded" for p in probes):
            return True
        probes.append(str(uuid.uuid4()))
        produce_event(outboxkit_kafka_bootstrap, topic, probes[-1], "p", 0, partition=1)
        return False

    wait_for(consuming, timeout=BOUND, what="the consumer fetching")
    for n, event_id in enumerate([held, *behind]):
        produce_event(outboxkit_kafka_bootstrap, topic, event_id, f"o{n}", n)
    for event_id in [held, *behind]:  # the old rejoin skipped them: this timed out
        wait_for(
            lambda e=event_id: inbox_state(outboxkit_db_url, e) == "succeeded",
            timeout=BOUND,
            what=f"{event_id} succeeded",
        )
    assert {where for where, _ in harness.refused} == {(topic, 0)}
    assert len(harness.refused) >= gate_module.SEEK_ATTEMPTS  # it did rejoin
    ours = [e[0] for e in effects(outboxkit_db_url) if e[0] not in probes]
    assert ours == [held, *behind]  # each once, in order


def test_a_held_record_that_left_the_log_before_the_rejoin_ends_dead(
    refusing: Callable[..., RefusedSeeks],
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
) -> None:
    """The held record is deleted while its retry waits; the new member's start (the held
    offset, committed) is then before the log's start, and it begins at the first record left:
    the gone record's event ends dead as when a seek back finds it gone (the new client takes
    the hold over); it stayed processing before."""
    topic = outboxkit_topic()
    held, later = str(uuid.uuid4()), str(uuid.uuid4())
    produce_event(outboxkit_kafka_bootstrap, topic, held, "o-held", 1)
    policy = RetryPolicy(initial_delay=5, max_delay=5)  # the seeks start once it is deleted
    harness = refusing(topic, Behaviour(fail_attempts=1, fail_only=held), policy=policy)
    wait_for(
        lambda: any(o.kind is OutcomeKind.RETRY for o in list(harness.outcomes)),
        timeout=BOUND,
        what="the event held for a retry",
    )
    admin = AdminClient({"bootstrap.servers": outboxkit_kafka_bootstrap})
    for done in admin.delete_records([TopicPartition(topic, 0, 1)]).values():
        assert done.result(timeout=30).low_watermark == 1
    produce_event(outboxkit_kafka_bootstrap, topic, later, "o-later", 2)
    wait_for(
        lambda: inbox_state(outboxkit_db_url, later) == "succeeded",
        timeout=BOUND,
        what="the record after the deleted one",
    )
    wait_for(
        lambda: inbox_state(outboxkit_db_url, held) == "dead", timeout=BOUND, what="held ended"
    )
    assert len(harness.refused) >= gate_module.SEEK_ATTEMPTS  # it was the rejoin's new client
    assert [e[0] for e in effects(outboxkit_db_url)] == [later]
