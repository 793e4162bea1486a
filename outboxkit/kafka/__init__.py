"""The one Kafka seam: build every Kafka client from the shared settings.

Implementations are imported on demand, so each client library stays an optional extra; asking
for one that is not installed raises a :class:`ConfigurationError` naming the extra to install.
The interfaces are in :mod:`outboxkit.kafka.api`.
"""

from __future__ import annotations

import importlib
from functools import cache
from typing import Any

from outboxkit.errors import ConfigurationError
from outboxkit.kafka.api import (
    Admin,
    AsyncGroupConsumer,
    AsyncRecordSender,
    CheckpointReader,
    GroupConsumer,
    RecordSender,
    TransactionalProducer,
)
from outboxkit.kafka.readback import TopicReadback
from outboxkit.settings import KafkaClient, KafkaSettings

_LIBRARY = {KafkaClient.CONFLUENT: "confluent_kafka", KafkaClient.AIOKAFKA: "aiokafka"}


@cache
def installed(client: KafkaClient) -> bool:
    """Whether the client library imports (not just whether a folder of that name exists)."""
    try:
        importlib.import_module(_LIBRARY[client])
    except ImportError:
        return False
    return True


def resolve_client(settings: KafkaSettings) -> KafkaClient:
    """The configured client, or confluent-kafka when installed, else aiokafka."""
    if settings.client is not None:
        _require(settings.client)
        return settings.client
    for client in (KafkaClient.CONFLUENT, KafkaClient.AIOKAFKA):
        if installed(client):
            return client
    raise ConfigurationError(
        "no Kafka client is installed:"
        " pip install 'outboxkit[confluent]' (or 'outboxkit[aiokafka]')"
    )


def _require(client: KafkaClient) -> None:
    if not installed(client):
        raise ConfigurationError(
            f"the {client.value} Kafka client is not installed:"
            f" pip install 'outboxkit[{client.value}]' (or set OUTBOXKIT_KAFKA_CLIENT)"
        )


def _build(client: KafkaClient, module: str, cls: str, *args: Any, **kwargs: Any) -> Any:
    _require(client)
    found = importlib.import_module(f"outboxkit.kafka.{client.value}_{module}")
    return getattr(found, cls)(*args, **kwargs)


class KafkaClients:
    """Every Kafka client outboxkit creates, from one :class:`KafkaSettings`."""

    def __init__(self, settings: KafkaSettings, *, timeout: float = 30.0) -> None:
        self.settings = settings
        self.timeout = timeout
        self.client = resolve_client(settings)

    def _make(self, module: str, kind: str, *args: Any, **kwargs: Any) -> Any:
        prefix = "Confluent" if self.client is KafkaClient.CONFLUENT else "Aiokafka"
        return _build(self.client, module, prefix + kind, self.settings, *args, **kwargs)

    def transactional_producer(
        self, transactional_id: str | None, **options: Any
    ) -> TransactionalProducer:
        """Exactly-once (with an id) or idempotent producer for the relay."""
        producer: TransactionalProducer = self._make(
            "producer",
            "TransactionalProducer",
            transactional_id=transactional_id,
            timeout=self.timeout,
            **options,
        )
        return producer

    def admin(self) -> Admin:
        admin: Admin = self._make("admin", "Admin", timeout=self.timeout)
        return admin

    def checkpoint_reader(self) -> CheckpointReader:
        reader: CheckpointReader = self._make(
            "checkpoint", "CheckpointReader", timeout=self.timeout
        )
        return reader

    def record_sender(self) -> RecordSender:
        """Sync dead-letter/acks producer (confluent-kafka)."""
        sender: RecordSender = _build(
            KafkaClient.CONFLUENT,
            "sender",
            "ConfluentRecordSender",
            self.settings,
            timeout=self.timeout,
        )
        return sender

    def async_record_sender(self) -> AsyncRecordSender:
        """Async dead-letter/acks producer (aiokafka)."""
        sender: AsyncRecordSender = _build(
            KafkaClient.AIOKAFKA,
            "sender",
            "AiokafkaRecordSender",
            self.settings,
            timeout=self.timeout,
        )
        return sender

    def topic_readback(self) -> TopicReadback:
        """A topic read to its end record by record, and records sent, on this thread, with
        the configured client (``inbox replay``): :mod:`outboxkit.kafka.readback`."""
        readback: TopicReadback = self._make("readback", "TopicReadback", timeout=self.timeout)
        return readback

    def group_consumer(self, group_id: str, **options: Any) -> GroupConsumer:
        """Sync consumer-group member (confluent-kafka)."""
        consumer: GroupConsumer = _build(
            KafkaClient.CONFLUENT,
            "consumer",
            "ConfluentGroupConsumer",
            self.settings,
            group_id,
            **options,
        )
        return consumer

    def async_group_consumer(self, group_id: str, **options: Any) -> AsyncGroupConsumer:
        """Async consumer-group member (aiokafka)."""
        consumer: AsyncGroupConsumer = _build(
            KafkaClient.AIOKAFKA,
            "consumer",
            "AiokafkaGroupConsumer",
            self.settings,
            group_id,
            **options,
        )
        return consumer


__all__ = ["KafkaClients", "installed", "resolve_client"]
