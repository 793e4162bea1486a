"""Example 07: the relay inside your own asyncio process instead of ``outboxkit relay run``.

Useful for a small service that wants one deployable, or for tests. The embedded relay is the
same fenced relay as the command: it takes the shard leases, so several copies of the service
can run and exactly one publishes each shard; the others stand by. Set ``stop`` to end it: it
releases its leases, so a standby takes over at once.

This script publishes what examples 01/02 wrote to the outbox, then stops::

    eval $(outboxkit dev env) && outboxkit migrate up
    python examples/02_sync_script/place_orders.py     # something to publish
    python examples/07_embedded_relay/embedded_relay.py
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import Counter

from sqlalchemy import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from outboxkit.kafka import KafkaClients
from outboxkit.relay import Relay
from outboxkit.settings import KafkaSettings, Settings, load_settings
from outboxkit.testing import outboxed_async

TOPIC = os.environ.get("EXAMPLE_TOPIC", "example.orders")


async def create_topics(kafka: KafkaSettings, *names: str) -> None:
    """The dev stack's broker does not auto-create topics (nor should production's). The admin
    client is built from the same settings as the relay's clients (TLS/SASL included)."""
    admin = KafkaClients(kafka).admin()
    try:
        for name in names:  # an existing topic is fine
            await admin.create_topic(name, partitions=2, config={})
    finally:
        await admin.close()


async def states(engine: AsyncEngine) -> Counter[str]:
    """Rows of our topic by state (pending, published, parked, ...)."""
    async with engine.connect() as conn:
        return Counter(message.state for message in await outboxed_async(conn, topic=TOPIC))


async def publish_pending(settings: Settings, patience: float = 60.0) -> Counter[str]:
    """Run the relay as a task of this event loop until our topic has nothing pending."""
    stop = asyncio.Event()
    relay = Relay(settings, stop=stop)
    task = asyncio.create_task(relay.run())
    url = make_url(settings.database_url.get_secret_value()).set(drivername="postgresql+psycopg")
    engine = create_async_engine(url)
    try:
        deadline = time.monotonic() + patience
        while (found := await states(engine))["pending"]:
            if task.done():
                task.result()  # the relay ended early: raise its error
            if time.monotonic() > deadline:
                raise TimeoutError(f"still pending after {patience:.0f} s: {dict(found)}")
            await asyncio.sleep(0.1)
        return found
    finally:
        stop.set()  # releases the leases: a standby (another copy of the service) takes over
        await task
        await engine.dispose()


async def main(database_url: str | None = None, bootstrap: str | None = None) -> Counter[str]:
    # The same settings as `outboxkit relay run`: OUTBOXKIT_* variables and OUTBOXKIT_CONFIG,
    # here with the dev stack passed in and a short idle wait.
    settings = load_settings(
        overrides={
            "database": {"url": database_url},
            "kafka": {"bootstrap": bootstrap},
            "relay": {"poll_interval": 0.5},
        }
    )
    # The dead-letter topic is for the consumers of examples 04 and 05.
    await create_topics(settings.kafka, TOPIC, f"{TOPIC}.dlq")
    return await publish_pending(settings)


if __name__ == "__main__":
    print(dict(asyncio.run(main())))
