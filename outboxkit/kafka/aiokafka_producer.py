"""The relay's producer on aiokafka: natively asyncio. Same contract as the confluent one."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from outboxkit.errors import ProducerFencedError, PublishError
from outboxkit.kafka.api import Delivery, ProduceRequest, RecordError, TransactionalProducer
from outboxkit.kafka.config import aiokafka_options
from outboxkit.kafka.errors import ErrorKind, classify
from outboxkit.settings import KafkaSettings


def _name(exc: BaseException) -> str:
    return type(exc).__name__


def raise_for(exc: BaseException, what: str) -> None:
    """Raise the outboxkit error for a failed client call: fenced, or retriable."""
    if classify(_name(exc)) is ErrorKind.FENCED:
        raise ProducerFencedError(f"{what}: {_name(exc)}: {exc}") from exc
    raise PublishError(f"{what}: {_name(exc)}: {exc}") from exc


def _unusable(exc: AssertionError, what: str) -> PublishError:
    """aiokafka checks its transaction state machine with ``assert``: after a fatal error (seen
    during a broker restart) ``abort_transaction`` fails with "Invalid state transition
    FATAL_ERROR -> ABORTING_TRANSACTION". That is a producer to replace, not a relay crash."""
    return PublishError(f"{what} failed: producer in an unusable state ({exc})")


class AiokafkaTransactionalProducer(TransactionalProducer):
    def __init__(
        self,
        settings: KafkaSettings,
        *,
        transactional_id: str | None,
        timeout: float = 30.0,
        max_queue_bytes: int | None = None,
        **overrides: Any,
    ) -> None:
        # max_queue_bytes needs no option here: aiokafka's send() already waits while a
        # partition's batch (max_batch_size, 16 KiB) is full, so its buffer stays small.
        del max_queue_bytes
        self.transactional = transactional_id is not None
        self._timeout = timeout
        defaults: dict[str, Any] = {
            "linger_ms": 0,
            "request_timeout_ms": int(timeout * 1000),
        }
        if transactional_id is not None:
            defaults["transaction_timeout_ms"] = int(max(timeout * 2, 60) * 1000)
        self._options = aiokafka_options(
            settings,
            defaults,
            enable_idempotence=True,
            acks="all",
            transactional_id=transactional_id,
            **overrides,
        )
        self._producer: AIOKafkaProducer | None = None

    @property
    def _p(self) -> AIOKafkaProducer:
        if self._producer is None:
            raise PublishError("producer not started or already closed")
        return self._producer

    async def start(self) -> None:
        self._producer = AIOKafkaProducer(**self._options)
        try:
            # For a transactional producer this obtains the producer id and epoch, which fences
            # an older producer with the same transactional.id.
            await asyncio.wait_for(self._producer.start(), self._timeout)
        except (KafkaError, TimeoutError, OSError) as exc:
            await self.close()
            raise_for(exc, "producer start failed")

    async def topic_problem(self, topic: str) -> RecordError | None:
        try:
            metadata = await asyncio.wait_for(
                self._p.client.fetch_all_metadata(), min(self._timeout, 10)
            )
        except (KafkaError, TimeoutError, OSError) as exc:
            raise PublishError(f"metadata for topic {topic!r} unavailable: {exc}") from exc
        if topic in getattr(metadata, "unauthorized_topics", set()):
            return RecordError("TopicAuthorizationFailedError", f"topic {topic!r} not authorised")
        if topic not in metadata.topics():
            return RecordError("UnknownTopicOrPartitionError", f"topic {topic!r} does not exist")
        return None

    async def begin(self) -> None:
        try:
            await asyncio.wait_for(self._p.begin_transaction(), self._timeout)
        except (KafkaError, TimeoutError) as exc:
            raise_for(exc, "begin_transaction failed")
        except AssertionError as exc:
            raise _unusable(exc, "begin_transaction") from exc

    async def send(self, requests: Sequence[ProduceRequest]) -> list[Delivery]:
        producer = self._p
        pending: list[asyncio.Future[Any] | RecordError] = []
        for request in requests:
            try:
                future = await producer.send(
                    request.topic,
                    value=request.value,
                    key=request.key,
                    partition=request.partition,
                    headers=list(request.headers),
                )
                pending.append(future)
            except KafkaError as exc:
                if classify(_name(exc)) is ErrorKind.FENCED:
                    raise_for(exc, "send failed")
                pending.append(RecordError(_name(exc), str(exc)))
        results: list[Delivery] = []
        fenced: BaseException | None = None
        try:
            async with asyncio.timeout(self._timeout):
                for item in pending:  # every future is awaited: none left unretrieved
                    if isinstance(item, RecordError):
                        results.append(Delivery(error=item))
                        continue
                    try:
                        meta = await item
                        results.append(Delivery(meta.partition, meta.offset))
                    except KafkaError as exc:
                        if classify(_name(exc)) is ErrorKind.FENCED:
                            fenced = fenced or exc
                        results.append(Delivery(error=RecordError(_name(exc), str(exc))))
        except TimeoutError as exc:
            raise PublishError("delivery not acknowledged in time") from exc
        if fenced is not None:
            raise_for(fenced, "delivery failed")
        return results

    async def commit(self) -> None:
        try:
            await asyncio.wait_for(self._p.commit_transaction(), self._timeout)
        except (KafkaError, TimeoutError) as exc:
            raise_for(exc, "commit_transaction failed")
        except AssertionError as exc:
            raise _unusable(exc, "commit_transaction") from exc

    async def abort(self) -> None:
        try:
            await asyncio.wait_for(self._p.abort_transaction(), self._timeout)
        except (KafkaError, TimeoutError) as exc:
            raise_for(exc, "abort_transaction failed")
        except AssertionError as exc:
            raise _unusable(exc, "abort_transaction") from exc

    async def close(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            with contextlib.suppress(KafkaError, TimeoutError, OSError):
                await asyncio.wait_for(producer.stop(), self._timeout)
