"""A shard's failure streak as its log shows it.

While Kafka or the database stays away, a shard worker retries with back-off, and each retry is
a whole term: the lease taken, the term started, ended and released, then the error and the
wait. That was five lines per shard and retry, about 600 per shard over a ten-minute outage
with the default ``backoff_max`` of 5 s. :class:`RetryLog` keeps what an operator needs:

* the error line of each retry, in full for the first :data:`SHOWN_IN_FULL` retries of a
  streak (they show the back-off growing), then through a :class:`RepeatLimit` (the same error
  once a minute, with the count of its repeats; a new error at once);
* the lease and term lines of the first failed term at INFO, those of the retries after it at
  DEBUG (:attr:`term_level`): they say nothing the error line does not;
* one line when the shard works again (a batch's database mark committed: a Kafka commit
  whose mark fails is no recovery; or it passed a retention pass: a term in which nothing is
  pending may still fail at its first one), with its token, how many attempts failed and for
  how long. A streak that ends because the shard is held elsewhere, or its term
  was lost, ends quietly (:meth:`RetryLog.standby`): this process did not get it working.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from outboxkit.log_limit import RepeatLimit, Shown, normalised, one_line, suppressed_note

#: Retries of a streak whose error line is always shown: enough to see the back-off reach its
#: maximum from the default initial delay (0.2 s doubling to 5 s takes six).
SHOWN_IN_FULL = 8

_Line = tuple[str, str, float]  # the error's type name, its text, the wait after it


class RetryLog:
    """One shard worker's retry lines. Not thread-safe: a worker is one task."""

    def __init__(
        self,
        logger: logging.Logger,
        shard: int,
        *,
        shown_in_full: int = SHOWN_IN_FULL,
        window: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._logger = logger
        self._shard = shard
        self._shown_in_full = shown_in_full
        self._limit: RepeatLimit[_Line] = RepeatLimit(window=window, clock=clock)
        self._clock = clock
        self.attempts = 0  # failed attempts of the current streak (0: none)
        self.worked = False  # recovered() since the last failure: its back-off starts afresh
        self._since = 0.0

    @property
    def term_level(self) -> int:
        """The level of the lease and term lines: DEBUG while a streak goes on."""
        return logging.DEBUG if self.attempts else logging.INFO

    def retrying(self, error: str, text: str, delay: float) -> None:
        """An attempt failed with ``error`` (its type's name) saying ``text``; the next one
        comes after ``delay`` seconds."""
        if not self.attempts:
            self._since = self._clock()
        self.attempts += 1
        self.worked = False
        text = one_line(text)
        line = (error, text, delay)
        if self.attempts <= self._shown_in_full:
            self._show(Shown(None, line))
            return
        for shown in self._limit.admit((error, normalised(text)), line):
            self._show(shown)

    def recovered(self, token: int) -> None:
        """The shard works again in the term of ``token`` (cheap when it never stopped): the
        counts still pending, then one line saying so."""
        self.worked = True
        if not self.attempts:
            return
        attempts = self.attempts
        self.standby()
        self._logger.info(
            "shard %s: working again with token %s after %d failed attempt(s) over %.1fs",
            self._shard,
            token,
            attempts,
            self._clock() - self._since,
        )

    def standby(self) -> None:
        """The streak ends without this process getting the shard working (another holds
        it, or the term was lost): the counts still pending, and the next lines are at INFO."""
        for shown in self._limit.drain():
            self._show(shown)
        self.attempts = 0

    def _show(self, shown: Shown[_Line]) -> None:
        error, text, delay = shown.line
        note = f" {suppressed_note(shown.suppressed, shown.seconds)}" if shown.suppressed else ""
        self._logger.warning(
            "shard %s: %s: %s; retrying in %.2fs%s", self._shard, error, text, delay, note
        )
