"""The transactional producers' admin helpers (both clients): a topic's limits, and the admin
closed without its failure stopping the producer's close."""

from __future__ import annotations

import asyncio
import logging

from outboxkit.kafka.api import LIMIT_NAMES, Admin, TopicLimits


async def read_topic_limits(admin: Admin, topic: str) -> TopicLimits:
    """A topic's :class:`TopicLimits` (one request); ``PublishError`` when its configuration
    cannot be read (no DescribeConfigs permission: see ``UNAUTHORISED``; a timeout)."""
    found = await admin.topic_configs(topic, LIMIT_NAMES)
    size = found.get("max.message.bytes")
    try:
        limit = int(size) if size is not None else None
    except ValueError:
        limit = None
    return TopicLimits(limit, found.get("cleanup.policy"))


async def close_admin_quietly(admin: Admin | None, seconds: float) -> None:
    """Close a producer's admin (its topic-limit reads): its failure must not stop the close."""
    if admin is None:
        return
    try:
        await asyncio.wait_for(admin.close(), seconds)
    except Exception as exc:
        logging.getLogger("outboxkit.kafka").debug(
            "closing the admin client of a producer failed: %r", exc
        )
