"""Creating a confluent-kafka client whose configuration librdkafka may refuse.

librdkafka checks a configuration when the client is created and quotes some values in its
refusal ("Unsupported SASL mechanism: ..."); a value may be a secret put in the wrong place.
Every confluent client is created here, so a refused configuration is always a
:class:`ConfigurationError` naming the properties, never their values. Blocking calls that a
stopping relay gives up on run here too (:func:`in_slices`).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from confluent_kafka import KafkaError, KafkaException

from outboxkit.kafka.config import refused_configuration

Client = TypeVar("Client")
Result = TypeVar("Result")

#: The longest a blocking call runs on after its caller gave up on it (see :func:`in_slices`).
SLICE_SECONDS = 1.0
# A slice run out (a metadata request with no broker to ask answers _TRANSPORT at its timeout).
_TIMED_OUT = frozenset({KafkaError._TIMED_OUT, KafkaError._TRANSPORT})

#: Where the relay's and the tools' Kafka properties come from.
KAFKA_SETTINGS_HINT = "check the OUTBOXKIT_KAFKA_* settings ([kafka] in the config file)"


def create(
    factory: Callable[[dict[str, Any]], Client],
    conf: dict[str, Any],
    what: str,
    hint: str = KAFKA_SETTINGS_HINT,
) -> Client:
    """``factory(conf)``, or the typed refusal of ``conf``."""
    try:
        return factory(conf)
    except KafkaException as exc:  # an unknown property, a value librdkafka refuses
        error = exc.args[0] if exc.args else None
        code, text = ("unknown error", "")
        if isinstance(error, KafkaError):
            code, text = error.name(), error.str()
        raise refused_configuration(what, code, text, conf, hint) from None
    except (TypeError, ValueError) as exc:
        # confluent-kafka's own check of a value it reads itself (a callback that is not
        # callable, a flag that is not a bool): as permanent as librdkafka's refusal.
        raise refused_configuration(what, type(exc).__name__, str(exc), conf, hint) from None


async def in_slices(call: Callable[[float], Result], within: float) -> Result:
    """``call(seconds)``, a blocking librdkafka call, in a worker thread for up to ``within``.

    A call that cannot succeed (a broker refusing our login) takes its whole timeout, and a
    worker thread cannot be interrupted: cancelling the caller (a stopping relay) left it
    running, and the process could not exit before it ended. So it runs in slices of at most
    ``SLICE_SECONDS``, called again after a retriable error (librdkafka resumes the operation;
    a resumed ``init_transactions`` may return a retriable broker error the whole call would
    have retried) until ``within`` ends, and not again once its caller is cancelled.
    """
    given_up = threading.Event()
    try:
        return await asyncio.to_thread(sliced, call, within, given_up)
    except asyncio.CancelledError:
        given_up.set()
        raise


def sliced(call: Callable[[float], Result], within: float, given_up: threading.Event) -> Result:
    """:func:`in_slices`' loop, in the calling thread: ``call(seconds)`` in slices of at most
    ``SLICE_SECONDS`` for up to ``within``, not called again once ``given_up`` is set (a sync
    consumer's stop event: its wait then ends within a slice, not at the Kafka timeout)."""
    deadline = time.monotonic() + within
    while True:
        began = time.monotonic()
        length = max(0.001, min(SLICE_SECONDS, deadline - began))
        try:
            return call(length)
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            retriable = (
                isinstance(error, KafkaError)
                and not error.fatal()
                and not error.txn_requires_abort()
                and (error.retriable() or error.code() in _TIMED_OUT)
            )
            if not retriable or deadline - time.monotonic() <= 0:
                raise
            # An error before the slice ended is not retried sooner: no busy loop.
            if given_up.wait(max(0.0, began + length - time.monotonic())):
                raise
