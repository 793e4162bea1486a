"""Which Kafka errors a retry can fix, and which it cannot.

Both clients name their errors differently (librdkafka codes vs aiokafka exception classes); the
relay decides on one vocabulary: *permanent* (park the row with its reason), *fenced* (another
producer owns the transactional.id: we are a zombie) or *retriable* (back off, keep order).
"""

from __future__ import annotations

from enum import StrEnum

from outboxkit.errors import PublishError


class ErrorKind(StrEnum):
    PERMANENT = "permanent"
    FENCED = "fenced"
    RETRIABLE = "retriable"


_PERMANENT = frozenset(
    {
        # librdkafka error names (KafkaError.name())
        "MSG_SIZE_TOO_LARGE",
        "_MSG_SIZE_TOO_LARGE",
        "RECORD_LIST_TOO_LARGE",
        "UNKNOWN_TOPIC_OR_PART",
        "_UNKNOWN_TOPIC",
        "TOPIC_AUTHORIZATION_FAILED",
        "TOPIC_EXCEPTION",
        "INVALID_TOPIC_EXCEPTION",
        "INVALID_RECORD",
        "CORRUPT_MESSAGE",
        # aiokafka exception class names
        "MessageSizeTooLargeError",
        "RecordTooLargeError",
        "RecordListTooLargeError",
        "UnknownTopicOrPartitionError",
        "TopicAuthorizationFailedError",
        "InvalidTopicError",
        "InvalidRecordError",
        "CorruptRecordException",
    }
)

_FENCED = frozenset(
    {
        "_FENCED",
        "PRODUCER_FENCED",
        "INVALID_PRODUCER_EPOCH",
        "INVALID_PRODUCER_ID_MAPPING",
        "ProducerFenced",
        "InvalidProducerEpoch",
        "InvalidProducerIdMapping",
    }
)

# Not fencing: the relay's principal may not use its transactional.id (a missing ACL). Fenced
# means "lease lost, back to standby at once", and a shard whose every term ends that way at
# once spun through lease attempts; it is a retriable error instead (backs off, says the ACL),
# fixed once the ACL is granted.
_TRANSACTIONAL_ID_DENIED = (
    "TRANSACTIONAL_ID_AUTHORIZATION_FAILED",
    "TransactionalIdAuthorizationFailed",
)
TRANSACTIONAL_ID_ACL_HINT = (
    "the relay's Kafka principal may not use its transactional.id: grant it WRITE and DESCRIBE"
    " on the TransactionalId resources prefixed 'outboxkit-relay.' (kafka-acls --add"
    " --allow-principal User:<relay> --operation Write --operation Describe"
    " --transactional-id outboxkit-relay. --resource-pattern-type prefixed)"
)


def classify(name: str) -> ErrorKind:
    """The kind of a Kafka error, by its librdkafka name or aiokafka class name."""
    if name in _PERMANENT:
        return ErrorKind.PERMANENT
    if name in _FENCED:
        return ErrorKind.FENCED
    return ErrorKind.RETRIABLE


_AUTH_MARKERS = (
    "authentication failed",
    "sasl authentication",
    "_authentication",
    "sasl_authentication_failed",
    "saslauthenticationfailed",
    "authenticationfailed",
)
CREDENTIALS_HINT = (
    "Kafka refused the credentials: check OUTBOXKIT_KAFKA_SASL_USERNAME,"
    " OUTBOXKIT_KAFKA_SASL_PASSWORD and OUTBOXKIT_KAFKA_SASL_MECHANISM (or the"
    " sasl.oauthbearer.* / sasl.kerberos.* properties)"
)


def with_credentials_hint(text: str) -> str:
    """``text``, naming the settings to check when it reports an authentication failure.

    Clients report a refused login in their own words (librdkafka log lines, aiokafka exception
    names); the operator needs to know which setting to fix.
    """
    lowered = text.lower()
    if CREDENTIALS_HINT in text or not any(marker in lowered for marker in _AUTH_MARKERS):
        return text
    return f"{text} ({CREDENTIALS_HINT})"


_TRANSACTION_TIMEOUT_REFUSED = ("INVALID_TRANSACTION_TIMEOUT", "InvalidTransactionTimeout")
TRANSACTION_TIMEOUT_HINT = (
    "the broker's transaction.max.timeout.ms is below the relay's transaction timeout,"
    " max(2 x kafka_timeout, 60 s): raise the broker's setting (the confluent-kafka clients"
    " also take a lower transaction.timeout.ms in OUTBOXKIT_KAFKA_PROPERTIES)"
)


def with_transaction_timeout_hint(text: str) -> str:
    """aiokafka reports the broker's refusal of the transaction timeout as ``[Error 50]``
    alone, with nothing naming either setting."""
    if TRANSACTION_TIMEOUT_HINT in text or not any(n in text for n in _TRANSACTION_TIMEOUT_REFUSED):
        return text
    return f"{text} ({TRANSACTION_TIMEOUT_HINT})"


_TOPIC_WRITE_DENIED = ("TOPIC_AUTHORIZATION_FAILED", "TopicAuthorizationFailed")
TOPIC_WRITE_HINT = "grant it Write on the topic"


def with_topic_write_hint(text: str) -> str:
    """``text``, naming the missing ACL when it reports a record refused by its topic (the
    broker's error says only "authorization failed")."""
    if TOPIC_WRITE_HINT in text or not any(name in text for name in _TOPIC_WRITE_DENIED):
        return text
    return f"{text} (the relay's Kafka principal may not write to the topic: {TOPIC_WRITE_HINT})"


def with_acl_hint(text: str) -> str:
    """``text``, naming the missing ACL when it reports a refused transactional.id."""
    lowered = text.lower()
    if TRANSACTIONAL_ID_ACL_HINT in text or not any(
        name.lower() in lowered for name in _TRANSACTIONAL_ID_DENIED
    ):
        return text
    return f"{text} ({TRANSACTIONAL_ID_ACL_HINT})"


def not_read_to_end(where: str, position: int, end: int | None) -> PublishError:
    """A checkpoint read that ran out of time, saying how far it got: short of the partition's
    high watermark, a transaction still open holds back what follows it (or the broker is slow)."""
    if end is None:
        return PublishError(f"{where} not readable to its end in time")
    return PublishError(
        f"{where} not readable to its end in time (read to offset {position} of {end}: a"
        " transaction still open on the partition, or a slow broker, holds back the rest)"
    )
