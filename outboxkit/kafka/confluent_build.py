"""Creating a confluent-kafka client whose configuration librdkafka may refuse.

librdkafka checks a configuration when the client is created and quotes some values in its
refusal ("Unsupported SASL mechanism: ..."); a value may be a secret put in the wrong place.
Every confluent client is created here, so a refused configuration is always a
:class:`ConfigurationError` naming the properties, never their values. Blocking calls that a
stopping relay gives up on run here too (:func:`in_slices`), and a producer's handle is ended
here once no call on it runs (:class:`HandleCalls`).
"""

from __future__ import annotations

import asyncio
import threading
import time
import warnings
from collections.abc import Callable
from functools import partial
from typing import Any, TypeVar

from confluent_kafka import KafkaError, KafkaException

from outboxkit.kafka.api import SLICE_SECONDS
from outboxkit.kafka.config import refused_configuration

Client = TypeVar("Client")
Result = TypeVar("Result")

# A slice run out (a metadata request with no broker to ask answers _TRANSPORT at its timeout).
_TIMED_OUT = frozenset({KafkaError._TIMED_OUT, KafkaError._TRANSPORT})

# confluent-kafka 2.16's Producer.close() warns when its abort fails; it does for a producer
# whose init_transactions never finished, the one kind HandleCalls.destroy closes.
warnings.filterwarnings(
    "ignore", "Producer abort_transaction failed during close", RuntimeWarning, append=True
)

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


class HandleCalls:
    """The blocking calls on one librdkafka handle that run in worker threads, counted, so that
    :meth:`destroy` ends the handle only when none runs.

    Dropping our reference to a producer does not end its handle: any exception of a call on
    it keeps the call's frames, and with them the handle, for as long as a reference cycle
    holds the exception (a failed task and the frame awaiting it), until the garbage collector
    runs. A transactional producer given up while Kafka was away keeps asking for its producer
    id meanwhile; once Kafka answers, it bumps the epoch and fences the producer that replaced
    it. Ending the handle explicitly is safe only once no thread is inside a call on it.
    """

    def __init__(self) -> None:
        self._idle = threading.Condition()
        self._running = 0

    def bind(self, call: Callable[[float], Result]) -> Callable[[float], Result]:
        """``call`` (a call taking its timeout), counted while it runs: pass it to a worker
        thread or to :func:`in_slices`."""
        return partial(self._counted, call)

    def _counted(self, call: Callable[[float], Result], seconds: float) -> Result:
        with self._idle:
            self._running += 1
        try:
            return call(seconds)
        finally:
            with self._idle:
                self._running -= 1
                self._idle.notify_all()

    async def destroy(self, handle: Any, within: float) -> bool:
        """End ``handle`` (``close()``, confluent-kafka 2.13 and later; purge its messages
        first: it flushes without a timeout) once no call on it runs, waiting up to ``within``
        seconds in a worker thread. False: not known to be ended here (no ``close()``, a call
        still ran, or ``close()`` raised, e.g. its warning made an error); the garbage collector
        then ends it with its last reference, as before. ``close()`` itself
        is not bounded (a thread given up on would keep the process from exiting): call it only
        for a handle without an open transaction, which confluent-kafka 2.16 would abort
        without a timeout. Its abort of a producer still waiting for its id fails at once."""
        close = getattr(handle, "close", None)
        if close is None:
            return False
        return await asyncio.to_thread(self._close_when_idle, close, within)

    def _close_when_idle(self, close: Callable[[], Any], within: float) -> bool:
        with self._idle:  # held while it closes: a call that starts now runs after, refused
            if not self._idle.wait_for(lambda: self._running == 0, within):
                return False
            try:
                close()
            except (KafkaException, RuntimeError, SystemError):
                return False
            return True
