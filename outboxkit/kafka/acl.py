"""A missing Kafka ACL as the consumer's clients meet it: what to grant, said without flooding.

Both consumers and both one-record senders (dead letters, acknowledgements) share these, so the
two clients tell an operator the same thing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from outboxkit.errors import PermanentPublishError

CONSUMER_ACL_HINT = "grant its principal Read on its group and Read and Describe on its topics"
IDEMPOTENT_ACL_HINT = (
    "the idempotent producer of dead letters and acks gets no producer id: grant the consumer's"
    " principal Write and Describe on its dead-letter and acks topics"
)

# The refusal of a record's topic (no Write on it), by librdkafka's name or aiokafka's class.
TOPIC_REFUSED = frozenset({"TOPIC_AUTHORIZATION_FAILED", "TopicAuthorizationFailedError"})

# How long a refused producer id holds: records meanwhile fail without a new producer.
REFUSAL_PAUSE = 5.0
# How often one refusal of the consumer is said again while it lasts.
NOTICE_INTERVAL = 300.0

Clock = Callable[[], float]


class RefusalNotice:
    """A consumer refused for a missing ACL is polled again and again: each distinct refusal is
    logged once, and again every :data:`NOTICE_INTERVAL` while it lasts (a refused topic next
    to a readable one alternates with records, so "once per streak" would repeat every poll)."""

    def __init__(self, logger: logging.Logger, clock: Clock = time.monotonic) -> None:
        self._logger = logger
        self._clock = clock
        self._said: dict[str, float] = {}

    def refused(self, what: str) -> None:
        now = self._clock()
        last = self._said.get(what)
        if last is not None and now - last < NOTICE_INTERVAL:
            return
        if len(self._said) >= 64:  # bounded: texts name topics, a hostile list is not kept
            self._said.clear()
        self._said[what] = now
        self._logger.warning(
            "Kafka refused this consumer (%s): %s; nothing is consumed from them until then",
            what,
            CONSUMER_ACL_HINT,
        )


class RefusedFetchFilter(logging.Filter):
    """aiokafka's fetcher logs a topic it may not read once per partition and fetch (twice a
    second per partition while Read is missing or revoked): each such line is let through once
    per :data:`NOTICE_INTERVAL`, like the consumer's own notice that says what to grant."""

    MESSAGE = "Not authorized to read from topic %s."

    def __init__(self, clock: Clock = time.monotonic) -> None:
        super().__init__()
        self._clock = clock
        self._said: dict[str, float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg != self.MESSAGE:
            return True
        what, now = record.getMessage(), self._clock()
        last = self._said.get(what)
        if last is not None and now - last < NOTICE_INTERVAL:
            return False
        if len(self._said) >= 64:  # bounded, as in RefusalNotice
            self._said.clear()
        self._said[what] = now
        return True


class ProducerIdRefusal:
    """After the broker refused the sender's producer an id, records fail for
    :data:`REFUSAL_PAUSE` seconds without a new producer: each new one costs a connection, a
    login and a fatal error logged, and every acknowledgement and dead letter would make one.
    The record's outcome is the same either way (a permanent publish error)."""

    def __init__(self, clock: Clock = time.monotonic) -> None:
        self._clock = clock
        self._until = 0.0
        self._cause = ""

    def check(self, topic: str) -> None:
        """Raise the refusal again while it holds, naming ``topic``."""
        if self._cause and self._clock() < self._until:
            raise PermanentPublishError(self._text(topic, self._cause))

    def refused(self, topic: str, cause: str) -> PermanentPublishError:
        """Remember a refusal (``cause``: the client's error) and give the record's error."""
        self._until, self._cause = self._clock() + REFUSAL_PAUSE, cause
        return PermanentPublishError(self._text(topic, cause))

    @staticmethod
    def _text(topic: str, cause: str) -> str:
        return f"publish to {topic!r} failed: {cause} ({IDEMPOTENT_ACL_HINT})"


def publish_failure(topic: str, name: str, text: str) -> str:
    """A failed publish of a dead letter or an acknowledgement, in both clients' words; a topic
    refused names the ACL to grant (the error alone says only "authorization failed")."""
    failure = f"publish to {topic!r} failed: {name}: {text}"
    if name in TOPIC_REFUSED:
        return f"{failure} (grant the consumer's principal Write and Describe on {topic!r})"
    return failure


class TopicRefusal:
    """aiokafka's sender replaces its producer after a refused record (see
    :mod:`~outboxkit.kafka.aiokafka_sender`): while a topic's Write is missing, its records fail
    for :data:`REFUSAL_PAUSE` seconds without a new producer (a connection and a login) each;
    other topics are tried as usual."""

    def __init__(self, clock: Clock = time.monotonic) -> None:
        self._clock = clock
        self._held: dict[str, tuple[float, str]] = {}

    def check(self, topic: str) -> None:
        """Raise the topic's refusal again while it holds."""
        held = self._held.get(topic)
        if held is not None:
            if self._clock() < held[0]:
                raise PermanentPublishError(held[1])
            del self._held[topic]

    def refused(self, topic: str, text: str) -> PermanentPublishError:
        """Hold the refusal of ``topic`` (``text``: the record's error) and give it."""
        if len(self._held) >= 64:  # bounded: a callable may name many dead-letter topics
            self._held.clear()
        self._held[topic] = (self._clock() + REFUSAL_PAUSE, text)
        return PermanentPublishError(text)
