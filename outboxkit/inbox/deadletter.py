"""Dead-letter records: the original message plus headers saying why it died.

Publishing is at-least-once (the record is flushed before the inbox row becomes ``dead``), so a
dead-letter reader deduplicates by the ``event-id`` header it carries.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from outboxkit.errors import ConfigurationError
from outboxkit.inbox.envelope import Envelope
from outboxkit.inbox.steps import Publish
from outboxkit.settings.models import topic_template_problem

HEADER_DLQ_EVENT_ID = "dlq-event-id"
HEADER_DLQ_ERROR = "dlq-error"
HEADER_DLQ_ATTEMPTS = "dlq-attempts"
HEADER_DLQ_CONSUMER = "dlq-consumer"
HEADER_DLQ_SOURCE = "dlq-source"  # topic/partition/offset of the original delivery

DeadLetterTopic = str | Callable[[str], str]
DeadLetterCheck = Literal["fail", "warn", "off"]
DEFAULT_DEAD_LETTER_TOPIC = "{topic}.dlq"
# The producers' default maximum request (confluent-kafka's message.max.bytes); a dead-letter
# record is trimmed to fit it.
DEAD_LETTER_MAX_BYTES = 1_000_000
RECORD_OVERHEAD = 128
HEADER_OVERHEAD = 10
MIN_ERROR_BYTES = 200


def check_dead_letter_topic(setting: DeadLetterTopic | None) -> None:
    """Refuse a template that cannot be filled in (``"{topic}.{x}"``) when the consumer is
    built, not when the first record dies (:class:`ConfigurationError`). An empty name would be
    a topic nobody can create: ``None`` is how no dead letters are asked for (the settings'
    empty value becomes ``None``)."""
    if setting == "":
        raise ConfigurationError(
            "the dead-letter topic is empty: dead_letter=None sends no dead letters"
        )
    if isinstance(setting, str):
        problem = topic_template_problem(setting)
        if problem is not None:
            raise ConfigurationError(f"the dead-letter topic template is invalid: {problem}")


def dead_letter_topic(setting: DeadLetterTopic, source_topic: str) -> str:
    """``"{topic}.dlq"``-style template, a fixed name, or a callable of the source topic."""
    if callable(setting):
        return setting(source_topic)
    return setting.format(topic=source_topic)


def record_size(key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes]]) -> int:
    """An upper estimate of a record's size in a batch (varints and per-record overhead)."""
    size = RECORD_OVERHEAD + len(key or b"") + len(value or b"")
    return size + sum(len(n) + len(v) + HEADER_OVERHEAD for n, v in headers)


def dead_letter_headers(
    env: Envelope,
    *,
    consumer: str,
    event_id: str,
    error: str,
    attempts: int,
    max_bytes: int = DEAD_LETTER_MAX_BYTES,
) -> list[tuple[str, bytes]]:
    """The original headers plus ours, trimmed so the record fits ``max_bytes``: first the
    error text, then the original headers go (ours say why and where the record came from)."""
    extra = {
        HEADER_DLQ_EVENT_ID: event_id,
        HEADER_DLQ_ERROR: error[:4000],
        HEADER_DLQ_ATTEMPTS: str(attempts),
        HEADER_DLQ_CONSUMER: consumer,
        HEADER_DLQ_SOURCE: f"{env.topic}/{env.partition}/{env.offset}",
    }
    kept = [(n, v) for n, v in env.raw_headers if v is not None and n not in extra]
    ours = [(n, v.encode()) for n, v in extra.items()]
    over = record_size(env.key, env.value, kept + ours) - max_bytes
    if over <= 0:
        return kept + ours
    error_bytes = extra[HEADER_DLQ_ERROR].encode()
    trimmed = error_bytes[: max(len(error_bytes) - over, MIN_ERROR_BYTES)]
    extra[HEADER_DLQ_ERROR] = trimmed.decode("utf-8", errors="ignore")
    ours = [(n, v.encode()) for n, v in extra.items()]
    # The longest prefix of the original headers that still fits, in one pass: a record may
    # carry hundreds of thousands of tiny headers, so no re-summing per header dropped.
    room = max_bytes - record_size(env.key, env.value, ours)
    fits = 0
    for name, value in kept:
        room -= len(name) + len(value) + HEADER_OVERHEAD
        if room < 0:
            break
        fits += 1
    return kept[:fits] + ours


def dead_letter_record(
    setting: DeadLetterTopic, env: Envelope, max_bytes: int, **ours: Any
) -> Publish:
    """The dead letter of ``env`` (``ours``: :func:`dead_letter_headers`' keywords)."""
    headers = dead_letter_headers(env, max_bytes=max_bytes, **ours)
    return Publish(dead_letter_topic(setting, env.topic), env.key, env.value, headers)


def missing_topic(name: str) -> str:
    """The start-up problem of a dead-letter topic the cluster does not know.

    Write permission cannot be probed without writing: a refused publish at run time ends the
    event ``dead`` with the reason instead.
    """
    return (
        f"dead-letter topic {name!r} does not exist: create it (or set no dead-letter topic);"
        " events that exhaust their attempts would end dead without a dead-letter record"
    )
