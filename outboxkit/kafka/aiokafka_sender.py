"""Dead letters and acknowledgements on aiokafka: one record, acknowledged before returning.

The producer is idempotent, and Kafka gives a producer id only to a principal with Write on
some topic (or IdempotentWrite on the cluster): without Write on the dead-letter and acks
topics it cannot start (:class:`~outboxkit.kafka.acl.ProducerIdRefusal` spaces the next tries
out). The start-up check of those topics then asks a plain client, which needs no producer id
(asked through the producer only, it waited for ever, saying Kafka was away).

aiokafka numbers a record when it sends it and does not take the number back when the broker
refuses the record (a topic whose Write was revoked, a record too large): every later record to
that partition was then refused ``OutOfOrderSequenceNumber``, even once Write was granted again,
until a restart. So a failed record drops the producer; the next gets a new producer id
(:class:`~outboxkit.kafka.acl.TopicRefusal` spaces them out while a topic stays refused).
"""

from __future__ import annotations

import asyncio
import contextlib

from aiokafka import AIOKafkaProducer
from aiokafka.client import AIOKafkaClient
from aiokafka.cluster import ClusterMetadata
from aiokafka.errors import (
    ClusterAuthorizationFailedError,
    KafkaError,
    KafkaTimeoutError,
    TopicAuthorizationFailedError,
)

from outboxkit.errors import PermanentPublishError, PublishError, detail_of, named
from outboxkit.kafka.acl import ProducerIdRefusal, TopicRefusal, publish_failure
from outboxkit.kafka.aiokafka_certificate import CertificateWatch
from outboxkit.kafka.aiokafka_metadata import partitions_for
from outboxkit.kafka.aiokafka_stop import abandon_producer
from outboxkit.kafka.api import AsyncRecordSender, Headers
from outboxkit.kafka.config import aiokafka_options
from outboxkit.kafka.errors import ErrorKind, classify
from outboxkit.settings import KafkaSettings

#: Seconds each step of closing a producer may take when a caller cancels its send.
CANCEL_GRACE = 1.0


class AiokafkaRecordSender(AsyncRecordSender):
    """An idempotent producer (``acks=all``), started with the first record."""

    def __init__(self, settings: KafkaSettings, *, timeout: float = 30.0) -> None:
        self._settings = settings
        self._timeout = timeout
        self._producer: AIOKafkaProducer | None = None
        self._refusal = ProducerIdRefusal()
        self._refused_topics = TopicRefusal()

    async def _get(self) -> AIOKafkaProducer:
        if self._producer is None:
            producer = AIOKafkaProducer(
                **aiokafka_options(
                    self._settings,
                    enable_idempotence=True,
                    acks="all",
                    request_timeout_ms=int(self._timeout * 1000),
                )
            )
            try:
                # Bounded: aiokafka asks for a producer id until it gets one (Kafka gone after
                # the bootstrap, or brokers that cannot hand ids out).
                await asyncio.wait_for(producer.start(), self._timeout)
            except BaseException as exc:
                await producer.stop()  # a failed start keeps its connections otherwise
                if isinstance(exc, TimeoutError):
                    why = f"producer start not done within {self._timeout:g} s"
                    raise KafkaTimeoutError(why) from exc
                raise
            self._producer = producer
        return self._producer

    async def start(self) -> None:
        """Start the producer now (as the first record would)."""
        await self._get()

    async def send(
        self, topic: str, key: bytes | None, value: bytes | None, headers: Headers
    ) -> None:
        self._refusal.check(topic)
        self._refused_topics.check(topic)
        watch = CertificateWatch(self._settings)
        handed = False  # whether the record reached the producer
        try:
            with watch:
                producer = await self._get()
                await partitions_for(producer, topic, self._timeout)  # Kafka away: retriable
                handed = True
                try:
                    # aiokafka retries a record for as long as Kafka is away: bounded here, or
                    # a dead letter would hold its partition (and a stop) until Kafka is back.
                    async with asyncio.timeout(self._timeout):
                        await producer.send_and_wait(topic, value, key=key, headers=list(headers))
                except (TimeoutError, asyncio.CancelledError) as exc:
                    # Given up (as librdkafka's message timeout gives a record up), or the
                    # caller stopped waiting: the producer goes without delivering it (for a
                    # caller that stops, with a short bound: a stop must not wait for Kafka).
                    timed_out = isinstance(exc, TimeoutError)
                    await self._drop(abandon=True, within=None if timed_out else CANCEL_GRACE)
                    if not timed_out:
                        raise
                    text = f"not acknowledged within {self._timeout:g} s"
                    failure = publish_failure(topic, "KafkaTimeoutError", text)
                    raise PublishError(watch.explained(failure)) from exc
        except ClusterAuthorizationFailedError as exc:  # a missing ACL: no retry fixes it
            raise self._refusal.refused(topic, named(exc)) from exc
        except KafkaError as exc:
            if handed:
                await self._drop()  # its sequence numbers may be ahead of the broker's now
            name = type(exc).__name__
            text = watch.explained(publish_failure(topic, name, detail_of(exc) or "no detail"))
            if isinstance(exc, TopicAuthorizationFailedError):
                raise self._refused_topics.refused(topic, text) from exc
            cls = PermanentPublishError if classify(name) is ErrorKind.PERMANENT else PublishError
            raise cls(text) from exc

    async def topic_exists(self, topic: str) -> bool:
        watch = CertificateWatch(self._settings)
        try:
            with watch:
                try:
                    metadata = await (await self._get()).client.fetch_all_metadata()
                except ClusterAuthorizationFailedError:  # no producer id: ask without it
                    metadata = await self._metadata()
        except KafkaError as exc:
            text = watch.explained(f"metadata of {topic!r} not readable: {exc}")
            raise PublishError(text) from exc
        return topic in metadata.topics()

    async def _metadata(self) -> ClusterMetadata:
        timeout_ms = int(self._timeout * 1000)
        client = AIOKafkaClient(**aiokafka_options(self._settings, request_timeout_ms=timeout_ms))
        try:
            await client.bootstrap()
            return await client.fetch_all_metadata()
        finally:
            await client.close()

    async def _drop(self, *, abandon: bool = False, within: float | None = None) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            # Dropped either way, within the sender's timeout: the record's own error is the
            # one to tell (a failure here would take its place).
            with contextlib.suppress(Exception):
                if abandon:
                    await abandon_producer(producer, self._timeout if within is None else within)
                else:
                    await asyncio.wait_for(producer.stop(), self._timeout)

    async def close(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            await producer.stop()  # nothing left queued: a record not delivered abandons it
