"""Topic metadata and creation on aiokafka.

Metadata is asked for with ``allow_auto_topic_creation=False`` (aiokafka's admin ``describe_topics``
would let a broker with auto-creation on create the topic with its defaults: the checkpoint topic
must be created compacted, by :meth:`create_topic`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.client import AIOKafkaClient
from aiokafka.errors import KafkaError
from aiokafka.protocol.metadata import MetadataRequest

from outboxkit.errors import PermanentPublishError, PublishError, named
from outboxkit.kafka.aiokafka_certificate import CertificateWatch
from outboxkit.kafka.api import Admin, TopicInfo
from outboxkit.kafka.config import aiokafka_options
from outboxkit.settings import KafkaSettings

_UNKNOWN_TOPIC = 3  # UNKNOWN_TOPIC_OR_PARTITION
_TOPIC_ALREADY_EXISTS = 36
_UNAUTHORISED = {29: "TOPIC_AUTHORIZATION_FAILED", 31: "CLUSTER_AUTHORIZATION_FAILED"}


def _entries(resource: dict[str, Any]) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for entry in resource.get("config_entries", []):
        name = entry.get("config_names", entry.get("config_name"))
        out[str(name)] = entry.get("config_value")
    return out


class AiokafkaAdmin(Admin):
    def __init__(self, settings: KafkaSettings, *, timeout: float = 30.0) -> None:
        self._timeout = timeout
        self._settings = settings
        self._options = aiokafka_options(settings, request_timeout_ms=int(timeout * 1000))
        self._clients: tuple[AIOKafkaAdminClient, AIOKafkaClient] | None = None
        self._closed = False

    async def _ready(self) -> tuple[AIOKafkaAdminClient, AIOKafkaClient]:
        """Both clients, started (made here: aiokafka wants a running event loop). A read the
        relay gave up on may still be starting them when ``close()`` runs: they are closed here
        then, as nothing else would close them."""
        if self._closed:
            raise PublishError("admin client already closed")
        if self._clients is None:
            admin = AIOKafkaAdminClient(**self._options)
            client = AIOKafkaClient(**self._options)
            try:
                await self._call("cannot reach Kafka", admin.start())
                await self._call("cannot reach Kafka", client.bootstrap())
                if self._closed:
                    raise PublishError("admin client already closed")
            except BaseException:
                await admin.close()
                await client.close()
                raise
            self._clients = (admin, client)
        return self._clients

    async def _call(self, what: str, awaitable: Any) -> Any:
        with CertificateWatch(self._settings) as watch:
            try:
                return await asyncio.wait_for(awaitable, self._timeout)
            except (KafkaError, TimeoutError, OSError) as exc:
                code = getattr(exc, "errno", 0) if isinstance(exc, KafkaError) else 0
                name = _UNAUTHORISED.get(code)
                text = watch.explained(f"{what}: {named(exc)}")
                raise PublishError(text, error=name) from exc

    async def describe_topic(self, topic: str) -> TopicInfo | None:
        _, client = await self._ready()
        request = MetadataRequest([topic], allow_auto_topic_creation=False)
        response = await self._call(
            f"metadata for topic {topic!r}", client.send(client.get_random_node(), request)
        )
        for found in response.to_object()["topics"]:
            if found["topic"] != topic:
                continue
            if found["error_code"] == _UNKNOWN_TOPIC:
                return None
            if found["error_code"]:
                raise PublishError(f"metadata for topic {topic!r}: error {found['error_code']}")
            return TopicInfo(topic, len(found["partitions"]))
        return None

    async def _default_replication(self, topic: str) -> int:
        admin, client = await self._ready()
        broker = next(iter(client.cluster.brokers())).nodeId
        resource = ConfigResource(
            ConfigResourceType.BROKER, str(broker), {"default.replication.factor": None}
        )
        (response,) = await self._call("broker configuration", admin.describe_configs([resource]))
        (found,) = response.to_object()["resources"]
        if found["error_code"]:
            # A failed read used to give an empty answer taken for 1: a topic made with one
            # replica on a cluster that asks for three. The ACL is named only when refused.
            name = _UNAUTHORISED.get(found["error_code"])
            advice = "grant the principal DescribeConfigs on the Cluster, or" if name else "or"
            raise PublishError(
                f"broker configuration: error {found['error_code']} {name or ''}".rstrip()
                + f": default.replication.factor is needed to create topic {topic!r} with aiokafka"
                f" (which cannot ask for the broker's default): {advice} create the topic"
                " beforehand",
                error=name,
            )
        value = _entries(found).get("default.replication.factor")
        return int(value) if value else 1

    async def _create_topic(
        self,
        topic: str,
        partitions: int,
        config: dict[str, str],
        replication_factor: int | None,
    ) -> None:
        admin, _ = await self._ready()
        if replication_factor is None:
            replication_factor = await self._default_replication(topic)
        new = NewTopic(topic, partitions, replication_factor, topic_configs=dict(config))
        response = await self._call(f"cannot create topic {topic!r}", admin.create_topics([new]))
        for result in response.to_object()["topic_errors"]:
            code = result["error_code"]
            if code and code != _TOPIC_ALREADY_EXISTS:
                raise PublishError(
                    f"cannot create topic {topic!r}: error {code} {result.get('error_message')}"
                )

    async def topic_configs(self, topic: str, names: Sequence[str]) -> dict[str, str | None]:
        admin, _ = await self._ready()
        resource = ConfigResource(ConfigResourceType.TOPIC, topic, dict.fromkeys(names))
        (response,) = await self._call(
            f"configuration of topic {topic!r}", admin.describe_configs([resource])
        )
        (found,) = response.to_object()["resources"]
        code = found["error_code"]
        if code == _UNKNOWN_TOPIC:
            raise PermanentPublishError(f"topic {topic!r} does not exist")
        if code:
            name = _UNAUTHORISED.get(code)
            raise PublishError(
                f"configuration of topic {topic!r}: error {code} {name or ''}".rstrip(), error=name
            )
        entries = _entries(found)
        return {name: entries.get(name) for name in names}

    async def close(self) -> None:
        self._closed = True
        clients, self._clients = self._clients, None
        if clients is not None:
            try:
                await clients[0].close()
            finally:
                await clients[1].close()
