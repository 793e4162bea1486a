"""The exception hierarchy: one root, specific leaves.

Every error outboxkit raises derives from :class:`OutboxkitError`, so callers can catch the whole
family in one clause. A class's docstring is its default message. Driver errors are wrapped with
``raise ... from exc`` so the original stays in the traceback.
"""

from __future__ import annotations

import re
from typing import Any


def detail_of(exc: BaseException) -> str:
    """What ``exc`` says, without its class name: shown beside the name, which aiokafka's errors
    already put in their text (``KafkaTimeoutError: ...``, ``[Error 3] Name: ...``, or the bare
    name), so it was shown twice. The broker's error number stays."""
    text = str(exc)
    found = re.match(rf"(\[Error -?\d+\] )?{re.escape(type(exc).__name__)}(?:: |\Z)", text)
    if found is None:
        return text
    return ((found.group(1) or "") + text[found.end() :]).strip()


def named(exc: BaseException) -> str:
    """``Name: text`` of ``exc``, its class name once (see :func:`detail_of`)."""
    text = detail_of(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class OutboxkitError(Exception):
    """An outboxkit operation failed."""

    def __init__(self, message: str | None = None, **context: Any) -> None:
        self.context = context
        super().__init__(message or (self.__doc__ or "").strip())


class ConfigurationError(OutboxkitError):
    """The configuration is invalid."""


class OutOfRangeError(ConfigurationError, ValueError):
    """A numeric argument of the Python API is not a finite number inside its range. Also a
    ``ValueError``, which these checks raised before they joined the one root."""


class WrongTargetError(OutboxkitError, TypeError):
    """The outbox was given something to write on that is not a SQLAlchemy Session or
    Connection of its kind (sync or async). Also a ``TypeError``: a wrong argument type."""


class SharedConnectionError(ConfigurationError):
    """A second outbox write started on a connection while another was running on it (tasks
    or threads sharing one session): refused before it sent anything."""


def unlistenable(host: str, port: int, exc: BaseException, section: str) -> ConfigurationError:
    """A metrics address a process cannot bind (taken, unresolvable, privileged port): a setting
    to fix, told in one line naming it, not a traceback. ``section`` is ``relay`` or
    ``consumer``."""
    problem = getattr(exc, "strerror", None) or str(exc)
    env = f"OUTBOXKIT_{section.upper()}_METRICS"
    return ConfigurationError(
        f"the metrics endpoint cannot listen on {host!r} port {port}: {problem} (check"
        f" [{section}] metrics_host and metrics_port, {env}_HOST and {env}_PORT, or"
        " --metrics-host and --metrics-port)"
    )


class DevStackError(OutboxkitError):
    """The development stack (PostgreSQL or Kafka) could not be started or stopped."""


class SchemaError(OutboxkitError):
    """The database schema is not the one this version of outboxkit expects."""


class MigrationError(SchemaError):
    """A migration could not be applied."""


class ValidationError(OutboxkitError):
    """An outbox message is invalid and was not written."""


class PayloadTooLargeError(ValidationError):
    """The payload is larger than the configured maximum message size."""


class InvalidTopicError(ValidationError):
    """The topic name is not a valid Kafka topic name."""


class SerializationError(ValidationError):
    """The payload could not be serialised."""


class IdempotencyKeyConflictError(OutboxkitError):
    """The idempotency key was already used for different content."""


class LeaseLostError(OutboxkitError):
    """The lease (and its fencing token) is no longer held; stop at once, write nothing more."""


class PublishError(OutboxkitError):
    """A message could not be published to Kafka."""

    retriable: bool = True


class PermanentPublishError(PublishError):
    """Kafka rejected the message for a reason retrying will not fix."""

    retriable = False


class GroupProtocolError(PublishError):
    """Kafka refused this consumer a place in its group: no partition assignment strategy is
    offered by every member (``INCONSISTENT_GROUP_PROTOCOL``). It heals once those members
    leave (a member that crashed stays until its session times out), so a start refused so is
    tried again like one while Kafka is away; the text says what to align."""


class SendStoppedError(PublishError):
    """The consumer was stopped while a dead letter or an acknowledgement waited for Kafka:
    the send was given up after ``SEND_GRACE_SECONDS`` (the next ones at once while the stop
    lasts). A dead letter's or an acknowledgement's record is held: it comes again at the next
    start, and the send is made then."""

    def __init__(self, topic: str) -> None:
        super().__init__(f"publish to {topic!r} given up: the consumer is stopping")


class DecodeError(OutboxkitError):
    """A Kafka message could not be decoded into an event."""


class UnknownEventTypeError(DecodeError):
    """The message's event type has no registered model in this consumer."""


class MissingEventIdError(DecodeError):
    """The message carries no event id, so it cannot be deduplicated."""


class InvalidEventIdError(OutboxkitError):
    """The event id is not one a consumer could have read from a record (empty, too long, not
    UTF-8, or with control characters): no inbox row can have it."""


class RetentionWindowError(ConfigurationError):
    """The dedup retention window is shorter than the topic's retention (replays may re-apply)."""


class ProducerFencedError(PublishError):
    """Another producer took over this transactional.id: this one is a zombie and must stop."""

    retriable = False


class HandlerCommitError(OutboxkitError):
    """A handler tried to commit its session; the middleware commits it with the dedup row."""


class BatchTransactionEndedError(OutboxkitError):
    """A handler ended the batch's transaction (``session.rollback()``): the writes of the
    handlers before it are gone, so the batch is delivered again one event at a time."""


class HandlerTransactionAbortedError(OutboxkitError):
    """A handler returned leaving its transaction aborted (it caught a database error and went
    on): nothing more can commit in that transaction, so the handler counts as failed."""


class HandlerCancelledError(OutboxkitError):
    """A handler raised ``asyncio.CancelledError`` of its own (a child task it awaited, or an
    ``asyncio.run()`` inside a sync handler, was cancelled) while the consumer itself was not
    being cancelled: a failure of that handler, retried as any other."""
