"""An aiokafka admin closed while a read still starts its clients (a read the relay gave up on
runs on, see ``broker_limits``): ``close()`` found no clients to close, then the read stored its
started ones on the closed admin, where they stayed open for good (connections, a metadata
task), once per producer life that ended so."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from aiokafka.client import AIOKafkaClient

from outboxkit.errors import PublishError
from outboxkit.kafka import aiokafka_producer
from outboxkit.kafka.aiokafka_admin import AiokafkaAdmin
from outboxkit.kafka.api import LIMIT_NAMES
from outboxkit.relay.broker_limits import BrokerLimits
from outboxkit.settings import KafkaSettings

pytestmark = pytest.mark.integration


class _HeldBootstrap:
    """Every client's bootstrap waits for ``go`` (a stalled admin path); ``entered`` says one
    waits. ``clients``: those bootstrapped."""

    def __init__(self) -> None:
        self.go, self.entered = asyncio.Event(), asyncio.Event()
        self.clients: list[AIOKafkaClient] = []


@pytest.fixture
def held(monkeypatch: pytest.MonkeyPatch) -> Iterator[_HeldBootstrap]:
    hold = _HeldBootstrap()
    bootstrap = AIOKafkaClient.bootstrap

    async def held_bootstrap(self: AIOKafkaClient) -> Any:
        hold.entered.set()
        await hold.go.wait()
        hold.clients.append(self)
        return await bootstrap(self)

    monkeypatch.setattr(AIOKafkaClient, "bootstrap", held_bootstrap)
    yield hold
    hold.go.set()


def _open(clients: list[AIOKafkaClient]) -> list[AIOKafkaClient]:
    return [
        c
        for c in clients
        if c._sync_task is not None or any(n.connected() for n in c._conns.values())
    ]


async def test_an_admin_closed_while_a_read_starts_its_clients_closes_them(
    held: _HeldBootstrap, outboxkit_kafka_bootstrap: str
) -> None:
    admin = AiokafkaAdmin(KafkaSettings(bootstrap=outboxkit_kafka_bootstrap), timeout=15)
    read = asyncio.ensure_future(admin.topic_configs(f"t-{uuid.uuid4().hex}", LIMIT_NAMES))
    await held.entered.wait()
    await admin.close()
    held.go.set()
    with pytest.raises(PublishError, match="admin client already closed"):
        await read
    assert held.clients
    assert _open(held.clients) == []
    with pytest.raises(PublishError, match="admin client already closed"):
        await admin.topic_configs("t", LIMIT_NAMES)  # and none started again
    assert admin._clients is None


async def test_a_read_given_up_on_in_a_producer_life_that_ended_leaves_no_client_open(
    held: _HeldBootstrap, outboxkit_kafka_bootstrap: str
) -> None:
    settings = KafkaSettings(bootstrap=outboxkit_kafka_bootstrap)
    producer = aiokafka_producer.AiokafkaTransactionalProducer(settings, transactional_id=None)
    limits = BrokerLimits(0, read_budget=0.01)  # given up on while the bootstrap is held
    await limits.learn_all(producer, [f"t-{uuid.uuid4().hex}"], lambda: None)
    inflight = limits._inflight
    assert inflight is not None
    assert not inflight.done()
    await producer.close()  # the life ends
    held.go.set()
    await asyncio.wait([inflight])
    assert isinstance(inflight.exception(), PublishError)
    assert "admin client already closed" in str(inflight.exception())
    assert held.clients
    assert _open(held.clients) == []
