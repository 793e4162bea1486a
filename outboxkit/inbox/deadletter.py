"""Dead-letter records: the original message plus headers saying why it died.

Publishing is at-least-once (the record is flushed before the inbox row becomes ``dead``), so a
dead-letter reader deduplicates by the ``event-id`` header it carries.
"""

from __future__ import annotations

from collections.abc import Callable

from outboxkit.inbox.envelope import Envelope

HEADER_DLQ_EVENT_ID = "dlq-event-id"
HEADER_DLQ_ERROR = "dlq-error"
HEADER_DLQ_ATTEMPTS = "dlq-attempts"
HEADER_DLQ_CONSUMER = "dlq-consumer"
HEADER_DLQ_SOURCE = "dlq-source"  # topic/partition/offset of the original delivery

DeadLetterTopic = str | Callable[[str], str]
DEFAULT_DEAD_LETTER_TOPIC = "{topic}.dlq"


def dead_letter_topic(setting: DeadLetterTopic, source_topic: str) -> str:
    """``"{topic}.dlq"``-style template, a fixed name, or a callable of the source topic."""
    if callable(setting):
        return setting(source_topic)
    return setting.format(topic=source_topic)


def dead_letter_headers(
    env: Envelope, *, consumer: str, event_id: str, error: str, attempts: int
) -> list[tuple[str, bytes]]:
    extra = {
        HEADER_DLQ_EVENT_ID: event_id,
        HEADER_DLQ_ERROR: error[:4000],
        HEADER_DLQ_ATTEMPTS: str(attempts),
        HEADER_DLQ_CONSUMER: consumer,
        HEADER_DLQ_SOURCE: f"{env.topic}/{env.partition}/{env.offset}",
    }
    kept = [(n, v) for n, v in env.raw_headers if v is not None and n not in extra]
    return kept + [(n, v.encode()) for n, v in extra.items()]
