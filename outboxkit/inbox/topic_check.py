"""The start-up check of the topics a consumer publishes to: its dead-letter topics and its
acknowledgements topic, before it joins the group (sans-IO).

A missing (or, for confluent-kafka, unreadable) topic found only at run time costs every record
that needs it the producer's timeout (~30 s by default): a dead letter ends ``dead`` without its
record, an acknowledgement is only logged, and each holds its partition that long.
"""

from __future__ import annotations

import logging

from outboxkit.errors import ConfigurationError, PublishError
from outboxkit.inbox.deadletter import (
    DeadLetterCheck,
    DeadLetterTopic,
    dead_letter_topic,
    missing_topic,
)
from outboxkit.inbox.steps import Plan, Sleep, TopicExists

logger = logging.getLogger("outboxkit.inbox.consumer")

# Kafka not answering at start-up: ask again after this long, doubling up to the maximum.
START_RETRY_SECONDS = 0.5
START_RETRY_MAX_SECONDS = 5.0


def missing_acks_topic(name: str) -> str:
    return (
        f"acks topic {name!r} does not exist: create it (or set no acks topic); each"
        " acknowledgement would wait for the producer's timeout, holding its partition"
    )


def check_topics(
    topics: list[str],
    dead_letter: DeadLetterTopic | None,
    acks_topic: str | None,
    mode: DeadLetterCheck,
) -> Plan[list[str] | None]:
    """The problems of the topics published to (``mode``: ``"fail"`` raises
    :class:`ConfigurationError` naming the first, ``"warn"`` logs them, ``"off"`` looks for
    none); ``None``: stopped while waiting for Kafka."""
    if mode == "off":
        return []
    wanted = []
    if dead_letter is not None:
        for name in sorted({dead_letter_topic(dead_letter, t) for t in topics}):
            wanted.append((name, missing_topic(name)))
    if acks_topic is not None:
        wanted.append((acks_topic, missing_acks_topic(acks_topic)))
    problems = []
    for name, problem in wanted:
        exists = yield from topic_exists(name)
        if exists is None:
            return None
        if not exists:
            problems.append(problem)
    for problem in problems:
        if mode == "fail":
            raise ConfigurationError(problem)
        logger.warning(problem)
    return problems


def topic_exists(name: str) -> Plan[bool | None]:
    """Ask until Kafka answers: a consumer started while the broker is away waits (and says
    so) instead of exiting, as the relay does; only a topic that is really missing counts.
    ``None``: the consumer's stop event was set meanwhile (its wait ends at once then)."""
    pause = START_RETRY_SECONDS
    while True:
        try:
            return bool((yield TopicExists(name)))
        except PublishError as exc:
            logger.warning("waiting for Kafka before checking topic %s: %s", name, exc)
        if (yield Sleep(pause)) is True:
            return None
        pause = min(pause * 2, START_RETRY_MAX_SECONDS)
