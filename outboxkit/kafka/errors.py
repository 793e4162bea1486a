"""Which Kafka errors a retry can fix, and which it cannot.

Both clients name their errors differently (librdkafka codes vs aiokafka exception classes); the
relay decides on one vocabulary: *permanent* (park the row with its reason), *fenced* (another
producer owns the transactional.id: we are a zombie) or *retriable* (back off, keep order).
"""

from __future__ import annotations

from enum import StrEnum


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
        # aiokafka's name for a broker error code it does not know (INVALID_RECORD among them):
        # only a delivery's RecordError carries it (see aiokafka_producer._delivery_error).
        "UnknownError",
    }
)

_FENCED = frozenset(
    {
        "_FENCED",
        "PRODUCER_FENCED",
        "INVALID_PRODUCER_EPOCH",
        "INVALID_PRODUCER_ID_MAPPING",
        "TRANSACTIONAL_ID_AUTHORIZATION_FAILED",
        "ProducerFenced",
        "InvalidProducerEpoch",
        "InvalidProducerIdMapping",
        "TransactionalIdAuthorizationFailed",
    }
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
    " OUTBOXKIT_KAFKA_SASL_PASSWORD and OUTBOXKIT_KAFKA_SASL_MECHANISM"
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
