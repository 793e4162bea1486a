"""librdkafka's log lines, rate-limited per client.

librdkafka logs every failed attempt of its reconnect loop: a broker that refuses the TLS
handshake or the login, or that is not there, gives about twenty near-identical FAIL lines a
second for as long as the process runs. confluent-kafka hands each line to the ``logger``
property as ``logger.log(level, "%s [%s] %s", facility, client_name, line)``;
:class:`LibrdkafkaLog` is that object. It groups lines by level, facility, client and the line
with its varying parts normalised, logs the first of a group at once, counts the repeats within
a window and logs the first repeat after it with their number. A line after a quiet window is a
new incident: the last one's count is logged, then the line as a first one. There is no timer
thread: a count shows with the group's next line, or when the group is dropped to keep the
state bounded.
DEBUG lines (librdkafka's ``debug`` property) were asked for: they pass unlimited.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

#: How long the repeats of a logged line are only counted.
WINDOW_SECONDS = 60.0
#: The most groups one adapter remembers; the least recently seen is dropped first.
MAX_GROUPS = 128

_LINE = "%s [%s] %s"
_SUMMARY = _LINE + " (%d similar %s suppressed over %d s)"
Line = tuple[Any, ...]  # (facility, client name, text), as confluent-kafka passes them

# What varies between the lines of one failure, and is not worth a line of its own.
_VARYING = (
    (re.compile(r"\b\d+ms\b"), "…ms"),  # "(after 3ms in state APIVERSION_QUERY"
    # librdkafka's own repeat count, present on some lines of a failure and not on others.
    (re.compile(r",? ?\b\d+ identical error\(s\) suppressed"), ""),
    # A broker by its role, then by its node id: "ssl://host:9093/bootstrap", "host:9092/1".
    (re.compile(r"((?:://)?[\w.\-\[\]:]+:\d+)/(?:\d+|bootstrap)\b"), r"\1/…"),
    # The address tried, one of those the broker's (named) host resolves to.
    (re.compile(r"\bipv[46]#\S+"), "ipv…#…"),
)


def normalised(text: str) -> str:
    """``text`` as the key of its group: what varies within one failure replaced."""
    for pattern, replacement in _VARYING:
        text = pattern.sub(replacement, text)
    return text


@dataclass
class _Group:
    started: float  # when the group's last shown line was logged
    seen: float  # when the group's last line came, shown or not
    last: Line
    suppressed: int = 0


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
    ) -> None:
        self.logger = logger
        self.window = WINDOW_SECONDS if window is None else window
        self._max_groups = max(1, max_groups)
        self._clock = clock
        self._groups: OrderedDict[tuple[Any, ...], _Group] = OrderedDict()
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"LibrdkafkaLog({self.logger.name!r}, window={self.window:g})"

    def log(self, level: int, msg: str, *args: Any) -> None:
        """confluent-kafka's call for each librdkafka line. It must not raise: an exception here
        would be raised by the client's next ``poll`` instead of its result."""
        try:
            if level <= logging.DEBUG or len(args) != 3:  # asked for, or not librdkafka's shape
                self.logger.log(level, msg, *args)
                return
            if not self.logger.isEnabledFor(level):
                return
            line = tuple(str(arg) for arg in args)
            key = (level, line[0], line[1], normalised(line[2]))
            with self._lock:
                shown = self._admit(key, line)
            for line_level, text, line_args in shown:
                self.logger.log(line_level, text, *line_args)
        except Exception:  # a line that cannot be grouped or formatted is shown as it came
            self.logger.log(level, "librdkafka log line %r", args)

    def _admit(self, key: tuple[Any, ...], line: Line) -> list[tuple[int, str, Line]]:
        """What to log for ``line`` (of group ``key``), the group's state updated."""
        now = self._clock()
        group = self._groups.get(key)
        if group is None:
            shown = [(key[0], _LINE, line)]
            self._groups[key] = _Group(now, now, line)
            while len(self._groups) > self._max_groups:
                (level, *_), old = self._groups.popitem(last=False)
                if old.suppressed:  # its count would be lost: its last line shows it
                    shown.append(_pending(level, old))
            return shown
        self._groups.move_to_end(key)
        if now - group.seen >= self.window:
            # Quiet for a whole window: a new incident. The last one's count, over its own span,
            # then this line as a first line (not one more repeat of a burst long over).
            shown = [_pending(key[0], group)] if group.suppressed else []
            shown.append((key[0], _LINE, line))
        elif now - group.started < self.window:
            group.suppressed += 1
            group.seen, group.last = now, line
            return []
        else:
            shown = [_summary(key[0], line, group.suppressed, now - group.started)]
        group.started, group.seen, group.last, group.suppressed = now, now, line, 0
        return shown


def _pending(level: int, group: _Group) -> tuple[int, str, Line]:
    """A group's last line, not shown when it came, with the count of the others not shown."""
    return _summary(level, group.last, group.suppressed - 1, group.seen - group.started)


def _summary(level: int, line: Line, suppressed: int, seconds: float) -> tuple[int, str, Line]:
    """``line``, followed by the number of the group's lines not shown, if any."""
    if suppressed <= 0:
        return level, _LINE, line
    lines = "line" if suppressed == 1 else "lines"
    return level, _SUMMARY, (*line, suppressed, lines, max(1, round(seconds)))
