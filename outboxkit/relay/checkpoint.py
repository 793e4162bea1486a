"""Exactly-once bookkeeping: the batch's outbox ids travel inside the same Kafka transaction.

Each transaction also writes the outbox ids and event ids to a compacted checkpoint topic, keyed
by ``<group>/<shard>`` (producer slot 0) or ``<group>/<shard>/<slot>`` (slot 1 and up: a shard
uses its transactional ids in turn), on the shard's own partition. A relay that takes over a
shard first calls ``init_transactions`` on every slot's id (which fences the old producer and
resolves its open transaction), then reads the last *committed* checkpoint of every slot
(``read_committed``) and marks those rows published, oldest first, before publishing anything.
So a relay killed after the Kafka commit but before the database mark leaves no duplicate behind
for ``read_committed`` consumers.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from uuid import UUID

from outboxkit.errors import PublishError
from outboxkit.kafka import KafkaClients
from outboxkit.kafka.api import ProduceRequest, TransactionalProducer

TOPIC_REFUSED = "TOPIC_AUTHORIZATION_FAILED"  # the readers' context["error"] for a missing ACL
CHECKPOINT_TOPIC_CONFIG = {"cleanup.policy": "compact", "segment.ms": "600000"}


def checkpoint_key(group: str, shard: int, slot: int = 0) -> bytes:
    """Slot 0 keeps the key of a single-producer relay, so its checkpoints stay readable."""
    return (f"{group}/{shard}" if slot == 0 else f"{group}/{shard}/{slot}").encode()


@dataclass(frozen=True)
class Checkpoint:
    """The rows one committed transaction carried, as (outbox id, event id) pairs."""

    group: str
    shard: int
    token: int
    rows: tuple[tuple[int, str], ...]  # event ids as text, as claimed
    slot: int = 0
    seq: int = 0  # commit order within the token's term (the slots commit strictly in turn)

    def encode(self) -> bytes:
        return json.dumps(
            {
                "token": self.token,
                "seq": self.seq,
                "ids": [row_id for row_id, _ in self.rows],
                "event_ids": [event_id for _, event_id in self.rows],
            }
        ).encode()

    @classmethod
    def decode(cls, group: str, shard: int, value: bytes, slot: int = 0) -> Checkpoint:
        """The checkpoint in ``value``, or :class:`PublishError` if it cannot be read: without it
        the rows of the last committed transaction cannot be told apart, so the shard must not
        publish (it retries with back-off, saying why, until the record is fixed)."""
        try:
            body = json.loads(value)
            # str(UUID(e)): checked and canonical, as the claim returns it (takeover only)
            pairs = zip(body["ids"], body["event_ids"], strict=True)
            rows = tuple((_integer(i), str(UUID(e))) for i, e in pairs)
            token, seq = _integer(body["token"]), _integer(body.get("seq", 0))
            return cls(group, shard, token, rows, slot, seq)
        except (
            ValueError,
            TypeError,
            KeyError,
            AttributeError,
            RecursionError,  # deeply nested JSON
        ) as exc:
            key = checkpoint_key(group, shard, slot).decode()
            raise PublishError(
                f"the checkpoint under key {key!r} is unreadable ({type(exc).__name__}: {exc});"
                f" shard {shard} publishes nothing until it is a valid checkpoint again"
            ) from None


def _integer(value: object) -> int:
    """A JSON integer; a float (1.5, 1e999), a string or a boolean is not an id or a token."""
    if type(value) is not int:
        raise TypeError(f"{type(value).__name__} where an integer belongs")
    return value


class CheckpointTopic:
    """Where checkpoints go and how the last committed one is read back (either Kafka client)."""

    def __init__(self, kafka: KafkaClients, topic: str) -> None:
        self._kafka = kafka
        self.topic = topic
        self._partitions: int | None = None
        self._writable_for: set[object] = set()  # the terms whose takeover found Write granted

    def request(self, checkpoint: Checkpoint) -> ProduceRequest:
        assert self._partitions is not None, "ensure() first"
        return ProduceRequest(
            topic=self.topic,
            key=checkpoint_key(checkpoint.group, checkpoint.shard, checkpoint.slot),
            value=checkpoint.encode(),
            partition=checkpoint.shard % self._partitions,
        )

    async def ensure(self, shard_count: int) -> None:
        """Create the compacted topic if missing (auto-creation is usually off); learn its size."""
        if self._partitions is not None:
            return
        admin = self._kafka.admin()
        try:
            found = await admin.describe_topic(self.topic)
            if found is None:
                await admin.create_topic(
                    self.topic, max(1, shard_count), dict(CHECKPOINT_TOPIC_CONFIG)
                )
            deadline = time.monotonic() + self._kafka.timeout
            while found is None or not found.partitions:
                # A topic just created may show up without partitions for a moment.
                if time.monotonic() > deadline:
                    raise PublishError(f"checkpoint topic {self.topic} has no partitions")
                await asyncio.sleep(0.1)
                found = await admin.describe_topic(self.topic)
            self._partitions = found.partitions
        finally:
            await admin.close()

    async def check_writable(self, producer: TransactionalProducer, term: object) -> None:
        """Asked at a shard's takeover (``term``: its shard and lease token) until answered
        yes, so a grant is seen without a restart and the producer lives of a healthy term ask
        nothing: without Write on this topic confluent-kafka purges each transaction whole,
        naming nothing, and every shard would retry it for ever. Only a refusal for want of an
        ACL stops the takeover; anything else (no answer, a topic not yet known to the broker
        asked) goes on as before."""
        if term in self._writable_for:
            return
        try:
            problem = await producer.topic_problem(self.topic)
        except PublishError:
            return
        if problem is not None and "AUTHORIZATION" in problem.name.upper():
            raise PublishError(
                f"the relay's checkpoint topic refuses it: {problem}; nothing is published"
                " until it can write its checkpoints",
                error=problem.name,
            )
        if len(self._writable_for) >= 1024:  # terms long over
            self._writable_for.clear()
        self._writable_for.add(term)

    async def last_committed(self, group: str, shard: int, slot: int = 0) -> Checkpoint | None:
        assert self._partitions is not None, "ensure() first"
        reader = self._kafka.checkpoint_reader()
        try:
            value = await reader.last_committed(
                self.topic, shard % self._partitions, checkpoint_key(group, shard, slot)
            )
        except PublishError as exc:
            if exc.context.get("error") != TOPIC_REFUSED:
                raise
            # Both clients say only "Topic authorization failed": name the ACL that is missing.
            raise PublishError(
                f"{exc} (the relay's Kafka principal needs Read on the checkpoint topic"
                f" {self.topic!r})",
                **exc.context,
            ) from exc
        finally:
            await reader.close()
        return None if value is None else Checkpoint.decode(group, shard, value, slot)

    async def all_committed(self, group: str, shard: int, slots: int) -> list[Checkpoint]:
        """The last committed checkpoint of every slot, oldest first (token, then commit seq)."""
        found = await asyncio.gather(*(self.last_committed(group, shard, n) for n in range(slots)))
        return sorted((c for c in found if c is not None), key=lambda c: (c.token, c.seq))
