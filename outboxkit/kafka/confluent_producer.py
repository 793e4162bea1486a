"""The default producer: confluent-kafka (librdkafka), blocking calls run in a worker thread."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from functools import partial
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from outboxkit.errors import ProducerFencedError, PublishError
from outboxkit.relay.producer.base import Delivery, ProduceRequest, RecordError, RelayProducer
from outboxkit.relay.producer.errors import ErrorKind, classify

_UNASSIGNED = -1  # librdkafka's RD_KAFKA_PARTITION_UA: the partitioner picks


def _raise_for(exc: KafkaException, what: str) -> None:
    error = exc.args[0] if exc.args else None
    name = error.name() if isinstance(error, KafkaError) else type(exc).__name__
    if classify(name) is ErrorKind.FENCED:
        raise ProducerFencedError(f"{what}: {error}") from exc
    raise PublishError(f"{what}: {error}") from exc


class ConfluentProducer(RelayProducer):
    def __init__(
        self,
        bootstrap: str,
        *,
        transactional_id: str | None,
        timeout: float = 30.0,
        options: dict[str, Any] | None = None,
    ) -> None:
        self.transactional = transactional_id is not None
        self._timeout = timeout
        self._config: dict[str, Any] = {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            # Each batch is flushed at once (flush ignores linger), so linger costs no latency; it
            # lets librdkafka build full requests instead of one tiny request per message.
            "linger.ms": 5,
            # The Java-compatible partitioner, as aiokafka uses: a key maps to the same
            # partition whichever producer implementation the relay runs.
            "partitioner": "murmur2_random",
            "message.timeout.ms": int(timeout * 1000),
            "socket.connection.setup.timeout.ms": 5000,
            "reconnect.backoff.max.ms": 1000,
        }
        if transactional_id is not None:
            self._config["transactional.id"] = transactional_id
            self._config["transaction.timeout.ms"] = int(max(timeout * 2, 60) * 1000)
        self._config.update(options or {})
        self._producer: Producer | None = None

    @property
    def _p(self) -> Producer:
        if self._producer is None:
            raise PublishError("producer not started or already closed")
        return self._producer

    async def start(self) -> None:
        try:
            self._producer = Producer(self._config)
            if self.transactional:
                await asyncio.to_thread(self._p.init_transactions, self._timeout)
        except KafkaException as exc:
            _raise_for(exc, "init_transactions failed")

    async def topic_problem(self, topic: str) -> RecordError | None:
        try:
            metadata = await asyncio.to_thread(self._p.list_topics, topic, min(self._timeout, 10))
        except KafkaException as exc:
            error = exc.args[0]
            if isinstance(error, KafkaError) and classify(error.name()) is ErrorKind.PERMANENT:
                return RecordError(error.name(), error.str())
            raise PublishError(f"metadata for topic {topic!r} unavailable: {error}") from exc
        found = metadata.topics.get(topic)
        if found is None:
            return RecordError("UNKNOWN_TOPIC_OR_PART", f"topic {topic!r} does not exist")
        error = found.error
        if error is not None:
            if classify(error.name()) is ErrorKind.PERMANENT:
                return RecordError(error.name(), f"topic {topic!r}: {error.str()}")
            raise PublishError(f"metadata for topic {topic!r}: {error}")
        return None

    async def begin(self) -> None:
        try:
            self._p.begin_transaction()
        except KafkaException as exc:
            _raise_for(exc, "begin_transaction failed")

    async def send(self, requests: Sequence[ProduceRequest]) -> list[Delivery]:
        results: list[Delivery | None] = [None] * len(requests)

        def deliver(index: int, err: KafkaError | None, msg: Any) -> None:
            if err is not None:
                results[index] = Delivery(error=RecordError(err.name(), err.str()))
            else:
                results[index] = Delivery(msg.partition(), msg.offset())

        producer = self._p
        produce = producer.produce
        for index, request in enumerate(requests):
            topic, key, value, given_headers, partition = request
            headers: Any = given_headers if type(given_headers) is list else list(given_headers)
            while True:
                try:
                    produce(
                        topic,
                        value,
                        key,
                        _UNASSIGNED if partition is None else partition,
                        on_delivery=partial(deliver, index),
                        headers=headers,
                    )
                    break
                except BufferError:
                    await asyncio.to_thread(producer.poll, 0.05)
                except KafkaException as exc:
                    error = exc.args[0]
                    if isinstance(error, KafkaError) and error.fatal():
                        _raise_for(exc, "produce failed")
                    name = error.name() if isinstance(error, KafkaError) else "UNKNOWN"
                    text = error.str() if isinstance(error, KafkaError) else str(exc)
                    results[index] = Delivery(error=RecordError(name, text))
                    break
        deadline = time.monotonic() + self._timeout
        while None in results:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise PublishError("delivery not acknowledged in time")
            await asyncio.to_thread(producer.flush, min(remaining, 1.0))
        return [r for r in results if r is not None]

    async def commit(self) -> None:
        try:
            await asyncio.to_thread(self._p.commit_transaction, self._timeout)
        except KafkaException as exc:
            _raise_for(exc, "commit_transaction failed")

    async def abort(self) -> None:
        try:
            await asyncio.to_thread(self._p.abort_transaction, self._timeout)
        except KafkaException as exc:
            _raise_for(exc, "abort_transaction failed")

    async def close(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            # Never reused: pending messages of an abandoned life are purged, not sent later.
            try:
                producer.purge()
                await asyncio.to_thread(producer.flush, 0)
            except (KafkaException, RuntimeError):
                pass
