"""Topic metadata and creation on confluent-kafka's AdminClient (blocking calls in a thread)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Collection, Sequence
from concurrent.futures import Future
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicCollection
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AclOperation,
    AdminClient,
    ConfigResource,
    NewTopic,
    ResourceType,
)

from outboxkit.errors import PermanentPublishError, PublishError
from outboxkit.kafka.api import SLICE_SECONDS, Admin, TopicInfo
from outboxkit.kafka.config import confluent_config
from outboxkit.kafka.confluent_build import create, in_slices
from outboxkit.settings import KafkaSettings

_MISSING = frozenset({"UNKNOWN_TOPIC_OR_PART", "_UNKNOWN_TOPIC", "UNKNOWN_TOPIC_ID"})


def _error(exc: KafkaException) -> KafkaError | None:
    error = exc.args[0] if exc.args else None
    return error if isinstance(error, KafkaError) else None


def _result(future: Future[Any], deadline: float, given_up: threading.Event) -> Any:
    """``future.result()`` until ``deadline``, in slices: a caller that gave up (a stopping
    relay) frees the worker thread within a slice instead of at the deadline, so the close
    and the exit that follow do not queue behind it."""
    while True:
        remaining = deadline - time.monotonic()
        try:
            return future.result(timeout=max(0.0, min(SLICE_SECONDS, remaining)))
        except TimeoutError:
            if given_up.is_set() or remaining <= SLICE_SECONDS:
                raise


class ConfluentAdmin(Admin):
    def __init__(self, settings: KafkaSettings, *, timeout: float = 30.0) -> None:
        self._timeout = timeout
        # Never let a metadata lookup create a topic with the broker's defaults: the checkpoint
        # topic must be created compacted, by create_topic.
        self._client: AdminClient | None = create(
            AdminClient,
            confluent_config(settings, {"allow.auto.create.topics": False}),
            "the Kafka admin client (confluent-kafka) cannot be created",
        )

    @property
    def _c(self) -> AdminClient:
        if self._client is None:
            raise PublishError("admin client already closed")
        return self._client

    async def _call(self, what: str, call: Any, *args: Any, **kwargs: Any) -> Any:
        return await self._answer(what, asyncio.to_thread(call, *args, **kwargs))

    async def _asked(self, what: str, ask: Any) -> Any:
        """:meth:`_call` of ``ask(given_up)``, which waits with :func:`_result`."""
        given_up = threading.Event()
        try:
            return await self._call(what, ask, given_up)
        except asyncio.CancelledError:
            given_up.set()
            raise

    async def _answer(self, what: str, answer: Awaitable[Any]) -> Any:
        try:
            return await answer
        except KafkaException as exc:
            error = _error(exc)
            name = error.name() if error is not None else None
            raise PublishError(f"{what}: {error or exc}", error=name) from None
        except TimeoutError:  # a future's result() waited in vain (concurrent.futures' is this)
            raise PublishError(f"{what}: no answer within {self._timeout}s") from None
        finally:  # serves librdkafka's log lines (and nothing else, for an admin); a call left
            # running may end after close(): then there is nothing to serve (nor raise)
            if self._client is not None:
                self._client.poll(0)

    async def describe_topic(self, topic: str) -> TopicInfo | None:
        client = self._c
        # In slices: a relay that stops while Kafka refuses its login does not wait for its end.
        metadata = await self._answer(
            f"metadata for topic {topic!r}",
            in_slices(
                lambda seconds: client.list_topics(topic=topic, timeout=seconds), self._timeout
            ),
        )
        found = metadata.topics.get(topic)
        if found is None:
            return None
        if found.error is not None:
            if found.error.name() in _MISSING:
                return None
            raise PublishError(f"metadata for topic {topic!r}: {found.error}")
        return TopicInfo(topic, len(found.partitions))

    async def _create_topic(
        self,
        topic: str,
        partitions: int,
        config: dict[str, str],
        replication_factor: int | None,
    ) -> None:
        new = NewTopic(
            topic,
            num_partitions=partitions,
            replication_factor=-1 if replication_factor is None else replication_factor,
            config=dict(config),
        )

        def create() -> None:
            futures = self._c.create_topics([new], operation_timeout=self._timeout)
            for future in futures.values():
                try:
                    future.result(timeout=self._timeout)
                except KafkaException as exc:
                    error = _error(exc)
                    if error is None or error.code() != KafkaError.TOPIC_ALREADY_EXISTS:
                        raise

        await self._call(f"cannot create topic {topic!r}", create)

    async def topic_configs(self, topic: str, names: Sequence[str]) -> dict[str, str | None]:
        resource = ConfigResource(ResourceType.TOPIC, topic)

        def describe(given_up: threading.Event) -> Any:
            (future,) = self._c.describe_configs([resource], request_timeout=self._timeout).values()
            try:
                return _result(future, time.monotonic() + self._timeout, given_up)
            except KafkaException as exc:
                error = _error(exc)
                if error is not None and error.name() in _MISSING:
                    return None
                raise

        entries = await self._asked(f"configuration of topic {topic!r}", describe)
        if entries is None:
            raise PermanentPublishError(f"topic {topic!r} does not exist")
        values: dict[str, str | None] = {}
        for name in names:
            entry = entries.get(name)
            values[name] = None if entry is None or entry.value is None else str(entry.value)
        return values

    async def may_write(self, topics: Collection[str]) -> dict[str, bool]:
        """Whether the broker lets this principal write to each topic (the operations it reports
        as authorised, KIP-430), in one request under one wait (the admin's timeout): a topic
        it says nothing about in time (no authorizer, an older broker, an error) is left out.

        A transactional producer learns of a missing Write ACL only as a failed transaction, with
        every record of it purged alike (``_PURGE_QUEUE``): no record names the topic refused.
        """
        asked = TopicCollection(sorted(topics))

        def describe(given_up: threading.Event) -> dict[str, bool]:
            try:
                futures = self._c.describe_topics(
                    asked, include_authorized_operations=True, request_timeout=self._timeout
                )
            except ValueError:  # a name librdkafka will not ask about (empty): all unknown
                return {}
            deadline = time.monotonic() + self._timeout
            answers: dict[str, bool] = {}
            for topic, future in futures.items():
                if given_up.is_set():
                    break
                try:
                    found = _result(future, deadline, given_up)
                except (KafkaException, TimeoutError):
                    continue  # unknown: missing, not describable, or no answer in time
                allowed = set(found.authorized_operations or ())
                if allowed:
                    answers[topic] = bool(allowed & {AclOperation.WRITE, AclOperation.ALL})
            return answers

        return dict(await self._asked("authorised operations of topics", describe))

    async def close(self) -> None:
        held, self._client = [self._client], None
        if held[0] is not None:
            # Dropping the last reference runs rd_kafka_destroy, which waits for the client's
            # threads: in a worker thread, not on the event loop.
            await asyncio.to_thread(_destroy, held)


def _destroy(held: list[AdminClient | None]) -> None:
    client = held.pop()
    if client is not None:
        client.poll(0)  # serves the log lines left
    del client
