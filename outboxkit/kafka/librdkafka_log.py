"""librdkafka's log lines, rate-limited per client.

confluent-kafka hands each librdkafka line to the ``logger`` property as ``logger.log(level,
"%s [%s] %s", facility, client_name, line)``; :class:`LibrdkafkaLog` is that object. It groups
lines by level, facility, client and the line with its varying parts normalised, and shows what
:class:`~outboxkit.log_limit.RepeatLimit` lets through: the first of a burst at once, the
repeats counted (``log_limit.py`` says how). DEBUG lines (librdkafka's ``debug`` property) were
asked for: they pass unlimited. Every line has its configuration's secret values masked
(:mod:`outboxkit.kafka.log_secrets`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from outboxkit.kafka.log_secrets import SecretMask
from outboxkit.log_limit import (
    MAX_GROUPS,
    WINDOW_SECONDS,
    RepeatLimit,
    Shown,
    normalised,
    suppressed_note,
)

__all__ = ["MAX_LEVEL", "WINDOW_SECONDS", "LibrdkafkaLog", "normalised"]

_LINE = "%s [%s] %s"
Line = tuple[Any, ...]  # (facility, client name, text), as confluent-kafka passes them

#: The highest level a librdkafka line is logged at. librdkafka logs every fatal error at its
#: most severe level, which confluent-kafka passes as CRITICAL: a transactional producer fenced
#: by a newer one (a relay shard's old holder still running, a zombie past its lease) logs two
#: such lines. A fatal error also reaches outboxkit through the client's API, which decides what it
#: means (a zombie standing down, a producer replaced, a consumer stopped with an error) and
#: logs that at its own level; the client's line is kept, as an ERROR.
MAX_LEVEL = logging.ERROR


class LibrdkafkaLog:
    """The ``logger`` of one client configuration: records go to ``logger`` (and through its
    filters) under its name. The client's name is part of every group's key, so a configuration
    given to several clients keeps their lines apart: one client's repeats never hide another's.
    Thread-safe: confluent-kafka calls it from whichever thread serves the client's events."""

    def __init__(
        self,
        logger: logging.Logger,
        *,
        window: float | None = None,
        max_groups: int = MAX_GROUPS,
        clock: Callable[[], float] = time.monotonic,
        mask: SecretMask | None = None,
    ) -> None:
        self.logger = logger
        self.mask = SecretMask() if mask is None else mask
        self._limit: RepeatLimit[Line] = RepeatLimit(
            window=window, max_groups=max_groups, clock=clock
        )
        self.window = self._limit.window

    def __repr__(self) -> str:
        return f"LibrdkafkaLog({self.logger.name!r}, window={self.window:g})"

    def log(self, level: int, msg: str, *args: Any) -> None:
        """confluent-kafka's call for each librdkafka line. It must not raise: an exception here
        would be raised by the client's next ``poll`` instead of its result."""
        try:
            level = min(level, MAX_LEVEL)
            if not self.logger.isEnabledFor(level):
                return
            if len(args) != 3:  # not librdkafka's shape
                self.logger.log(level, "%s", self.mask.masked(msg % args if args else msg))
                return
            line = (str(args[0]), str(args[1]), self.mask.masked(str(args[2])))
            if level <= logging.DEBUG:  # asked for: not limited
                self.logger.log(level, _LINE, *line)
                return
            key = (level, line[0], line[1], normalised(line[2]))
            for shown in self._limit.admit(key, line):
                self._show(shown)
        except Exception:  # a line that cannot be grouped or formatted: its text, masked
            self.logger.log(level, "librdkafka log line %s", self.mask.masked(_text(args)))

    def _show(self, shown: Shown[Line]) -> None:
        level = shown.key[0]  # type: ignore[index]  # the keys are made in log()
        if shown.suppressed <= 0:
            self.logger.log(level, _LINE, *shown.line)
        else:
            note = suppressed_note(shown.suppressed, shown.seconds)
            self.logger.log(level, _LINE + " %s", *shown.line, note)


def _text(args: tuple[Any, ...]) -> str:
    """The line's parts as text (``str``, not ``repr``: an escaped secret would not be found),
    each that cannot be printed by its ``repr``."""
    return " ".join(_part(arg) for arg in args)


def _part(arg: Any) -> str:
    try:
        return str(arg)
    except Exception:
        return repr(arg)
