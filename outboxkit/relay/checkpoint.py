"""Exactly-once bookkeeping: the batch's outbox ids travel inside the same Kafka transaction.

Each transaction also writes the outbox ids and event ids to a compacted checkpoint topic, keyed
by ``<group>/<shard>`` (producer slot 0) or ``<group>/<shard>/<slot>`` (slot 1 and up: a shard
uses its transactional ids in turn), on the shard's own partition. A relay that takes over a
shard first calls ``init_transactions`` on every slot's id (which fences the old producer and
resolves its open transaction), then reads the last *committed* checkpoint of every slot
(``read_committed``) and marks those rows published, oldest first, before publishing anything.
So a relay killed after the Kafka commit but before the database mark leaves no duplicate behind
for ``read_committed`` consumers.

The shard's partition is ``shard % partitions``, so it moves when partitions are added. Each
checkpoint records the count it was written with, and every takeover asks the count again
(writes use it from then on): counts only grow, so a checkpoint on the shard's partition that
was written with today's count is the newest; otherwise every partition an older count put the
shard on is read too, and the newest checkpoint of each slot wins.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from dataclasses import dataclass
from uuid import UUID

from outboxkit.errors import PublishError
from outboxkit.kafka import KafkaClients
from outboxkit.kafka.api import ProduceRequest, TransactionalProducer

logger = logging.getLogger("outboxkit.relay.checkpoint")

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
    partitions: int = 0  # the topic's partition count it was written with (0: not recorded)
    outbox: str = ""  # the outbox whose relay wrote it (outbox_setting.outbox_id; "": none)

    @property
    def order(self) -> tuple[int, int]:
        """Commit order among a shard's checkpoints: terms by token, then the term's sequence."""
        return self.token, self.seq

    def encode(self) -> bytes:
        return json.dumps(
            {
                "token": self.token,
                "seq": self.seq,
                "partitions": self.partitions,
                **({"outbox": self.outbox} if self.outbox else {}),
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
            partitions, outbox = _integer(body.get("partitions", 0)), body.get("outbox", "")
            if type(outbox) is not str:
                raise TypeError(f"{type(outbox).__name__} where an outbox identity belongs")
            return cls(group, shard, token, rows, slot, seq, partitions, outbox)
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

    def __init__(self, kafka: KafkaClients, topic: str, outbox: str = "") -> None:
        self._kafka = kafka
        self.topic = topic
        self.outbox = outbox  # this relay's outbox identity ("": unknown, nothing checked)
        self._partitions: int | None = None
        self._writable_for: set[object] = set()  # the terms whose takeover found Write granted
        self._counted_for: dict[int, int] = {}  # shard -> the token whose takeover asked the count

    def request(self, checkpoint: Checkpoint) -> ProduceRequest:
        """On the shard's partition by the count last asked, which the checkpoint records."""
        assert self._partitions is not None, "ensure() first"
        checkpoint = dataclasses.replace(
            checkpoint, partitions=self._partitions, outbox=self.outbox
        )
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
        self._partitions = await self._partition_count(shard_count)

    async def _partition_count(self, shard_count: int | None = None) -> int:
        """The topic's partition count; the topic is created if missing: at start-up with
        ``shard_count`` partitions, and again if it was deleted while the relay ran (else every
        takeover failed on it and the shards waited for a restart, which did the same), with as
        many as it last had, so the partitions checkpoints go to exist."""
        admin = self._kafka.admin()
        try:
            found = await admin.describe_topic(self.topic)
            if found is None:
                if shard_count is None:
                    shard_count = self._partitions or 1
                    logger.error(
                        "checkpoint topic %s was deleted while the relay ran: created again; the"
                        " rows of a Kafka transaction that committed before the deletion and"
                        " were not marked yet may be published again",
                        self.topic,
                    )
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
            return found.partitions
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

    async def all_committed(
        self, group: str, shard: int, slots: int, token: int | None = None
    ) -> list[Checkpoint]:
        """The last committed checkpoint of every slot, oldest first (token, then commit seq).

        The count is asked again first, once per term (``token``; None: every time): another
        process may have seen partitions added, and within a term only this one wrote. The
        shard's partition by that count is read; only if its newest checkpoint was written with
        a smaller count (or none is there) may a newer one lie elsewhere: on ``shard % n`` for a
        count ``n`` between that one and today's, which are read too."""
        assert self._partitions is not None, "ensure() first"
        if token is None or self._counted_for.get(shard) != token:
            self._partitions = max(self._partitions, await self._partition_count())
            self._counted_for[shard] = token if token is not None else -1
        partitions = self._partitions
        keys = {checkpoint_key(group, shard, slot): slot for slot in range(slots)}
        home = shard % partitions
        found = await self.read(home, group, shard, keys)
        newest = max(found.values(), key=lambda c: c.order, default=None)
        since = newest.partitions if newest is not None else 0
        if since < partitions:
            others = sorted({shard % n for n in range(max(1, since), partitions + 1)} - {home})
            for more in await asyncio.gather(*(self.read(p, group, shard, keys) for p in others)):
                for slot, checkpoint in more.items():
                    if slot not in found or checkpoint.order > found[slot].order:
                        found[slot] = checkpoint
        for checkpoint in found.values():
            self._check_ours(checkpoint)
        return sorted(found.values(), key=lambda c: c.order)

    def _check_ours(self, checkpoint: Checkpoint) -> None:
        """A checkpoint another outbox's relay wrote under our key names rows of another
        table: trusted, it would mark ours published unsent, or leave ours to be sent twice."""
        if checkpoint.outbox and self.outbox and checkpoint.outbox != self.outbox:
            key = checkpoint_key(checkpoint.group, checkpoint.shard, checkpoint.slot).decode()
            raise PublishError(
                f"the checkpoint under key {key!r} in {self.topic} was written by the relay of"
                f" another outbox (another database or schema): two outboxes share relay group"
                f" {checkpoint.group!r} on this Kafka cluster, and with it the checkpoint keys"
                " and transactional ids. Give each outbox its own group (OUTBOXKIT_RELAY_GROUP,"
                f" [relay] group); shard {checkpoint.shard} publishes nothing until then"
            )

    async def read(
        self, partition: int, group: str, shard: int, keys: dict[bytes, int]
    ) -> dict[int, Checkpoint]:
        """The last committed checkpoint under each key (``keys``: key -> slot) on a partition."""
        reader = self._kafka.checkpoint_reader()
        try:
            values = await reader.last_values(self.topic, partition, keys)
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
        return {
            keys[key]: Checkpoint.decode(group, shard, value, keys[key])
            for key, value in values.items()
        }
