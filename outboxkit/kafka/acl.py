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
