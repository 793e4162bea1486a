"""Repeated log lines, counted instead of shown.

Both Kafka clients log every failed attempt of their reconnect loops: a broker that is away, or
that refuses the TLS handshake or the login, gives librdkafka about twenty near-identical lines a
second and aiokafka about sixty, for as long as the outage lasts; a consumer whose database is
away logs each held record's retry, once a second per partition. :class:`RepeatLimit` decides
which lines of such a burst are shown: the first of a group at once; the repeats within a window
are counted, and the first one after it is shown with their number. A line after a quiet window
is a new incident: the last one's count is shown, then the line as a first one. There is no timer
thread: a count shows with the group's next line, when the group is dropped to keep the state
bounded, or (:class:`LimitedLines`) when its caller says the failure is over. The librdkafka
``logger`` (``kafka/librdkafka_log.py``), the aiokafka logging filter (``kafka/aiokafka_log.py``)
and :class:`LimitedLines` (the consumer's and the relay listener's own lines) each decide with
one.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

#: How long the repeats of a shown line are only counted.
WINDOW_SECONDS = 60.0
#: The most groups one limit remembers; the least recently seen is dropped first.
MAX_GROUPS = 128

Line = TypeVar("Line")

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


def one_line(text: str) -> str:
    """``text`` on one line: PostgreSQL's HINT and DETAIL, and libpq's reasons, come after line
    breaks, which split one log record into lines that line-based collectors read as several."""
    return " ".join(text.split()) if "\n" in text else text


def suppressed_note(suppressed: int, seconds: float) -> str:
    """What a shown line says of the lines of its group that were not shown."""
    lines = "line" if suppressed == 1 else "lines"
    return f"({suppressed} similar {lines} suppressed over {max(1, round(seconds))} s)"


@dataclass(frozen=True)
class Shown(Generic[Line]):
    """A line to show: ``suppressed`` lines of its group before it were not (0: none)."""

    key: Hashable
    line: Line
    suppressed: int = 0
    seconds: float = 0.0


@dataclass
class _Group(Generic[Line]):
    started: float  # when the group's last shown line was logged
    seen: float  # when the group's last line came, shown or not
    last: Line
    suppressed: int = 0


class RepeatLimit(Generic[Line]):
    """Which lines of each group to show. Thread-safe: clients log from their own threads."""

    def __init__(
        self,
        *,
        window: float | None = None,
        max_groups: int = MAX_GROUPS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.window = WINDOW_SECONDS if window is None else window
        self._max_groups = max(1, max_groups)
        self._clock = clock
        self._groups: OrderedDict[Hashable, _Group[Line]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        """How many groups it remembers."""
        return len(self._groups)

    def admit(self, key: Hashable, line: Line) -> list[Shown[Line]]:
        """What to show for ``line`` of group ``key`` (perhaps nothing, perhaps earlier lines
        with their counts), the group's state updated."""
        with self._lock:
            return self._admit(key, line)

    def drain(self) -> list[Shown[Line]]:
        """The failure is over: the last line of each group with lines not yet counted, with
        their count; every group forgotten, so the next line is a first one again."""
        with self._lock:
            pending = [_pending(key, g) for key, g in self._groups.items() if g.suppressed]
            self._groups.clear()
            return pending

    def _admit(self, key: Hashable, line: Line) -> list[Shown[Line]]:
        now = self._clock()
        group = self._groups.get(key)
        if group is None:
            shown = [Shown(key, line)]
            self._groups[key] = _Group(now, now, line)
            while len(self._groups) > self._max_groups:
                old_key, old = self._groups.popitem(last=False)
                if old.suppressed:  # its count would be lost: its last line shows it
                    shown.append(_pending(old_key, old))
            return shown
        self._groups.move_to_end(key)
        if now - group.seen >= self.window:
            # Quiet for a whole window: a new incident. The last one's count, over its own span,
            # then this line as a first line (not one more repeat of a burst long over).
            shown = [_pending(key, group)] if group.suppressed else []
            shown.append(Shown(key, line))
        elif now - group.started < self.window:
            group.suppressed += 1
            group.seen, group.last = now, line
            return []
        else:
            shown = [Shown(key, line, group.suppressed, now - group.started)]
        group.started, group.seen, group.last, group.suppressed = now, now, line, 0
        return shown


def _pending(key: Hashable, group: _Group[Line]) -> Shown[Line]:
    """A group's last line, not shown when it came, with the count of the others not shown."""
    return Shown(key, group.last, group.suppressed - 1, group.seen - group.started)


_Said = tuple[int, str, tuple[Any, ...]]  # a line of LimitedLines: level, format, arguments


class LimitedLines:
    """Lines of one of our loggers that repeat while a failure lasts (a consumer's retries, the
    relay listener's reconnects, while the database is away), through one :class:`RepeatLimit`.
    The caller names each line's kind: lines of one kind are counted together whatever their
    arguments (the record's place). ``shown_in_full``: the first lines of a failure that are
    all shown (a back-off growing, as the relay's shard lines show it), before the limit applies.
    One instance per loop: it is not meant for threads."""

    def __init__(
        self,
        logger: logging.Logger,
        *,
        window: float | None = None,
        shown_in_full: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger = logger
        self._clock = clock
        self._limit: RepeatLimit[_Said] = RepeatLimit(window=window, clock=clock)
        self._shown_in_full = shown_in_full
        self._lines = 0  # lines of the current failure
        self._since: float | None = None  # when the failure's first line came
        self._last = 0.0  # when its last line came
        self._answered: float | None = None  # the first success since then

    def log(
        self, level: int, kind: Hashable, msg: str, *args: Any, stacklevel: int = 1, **kwargs: Any
    ) -> None:
        """``logger.log(level, msg, *args, **kwargs)`` if the limit shows it (``kwargs``, e.g.
        ``exc_info``, only with this line, not with an earlier one shown later with its count);
        ``stacklevel`` as ``logger.log``'s, counted from the caller of this method."""
        now = self._clock()
        if self._since is None:
            self._since, self._lines = now, 0
        self._last, self._answered = now, None
        self._lines += 1
        if not self.logger.isEnabledFor(level):
            return
        if self._lines <= self._shown_in_full:
            self.logger.log(level, msg, *args, stacklevel=stacklevel + 1, **kwargs)
            return
        line = (level, msg, args)
        for shown in self._limit.admit((level, kind), line):
            # the record's caller: this method's (+2: _show, then this method)
            self._show(shown, kwargs if shown.line is line else {}, stacklevel + 2)

    def answered(self) -> None:
        """What failed worked again (cheap when nothing failed): see :meth:`end`."""
        if self._since is not None and self._answered is None:
            self._answered = self._clock()

    def end(self, level: int, msg: str, *, quiet: float = 0.0) -> None:
        """The failure is over if it worked again and no line of it came for ``quiet`` seconds
        (a failure that comes and goes is one, not an end and a first line each time); cheap
        when there was none. Then the counts still pending are logged, and ``msg`` with the
        failure's duration in seconds (to the first success) as its one argument; the next
        line is a first one again."""
        if self._since is None or self._answered is None:
            return
        if self._clock() - self._last < quiet:
            return
        seconds, self._since = self._answered - self._since, None
        for shown in self._limit.drain():
            self._show(shown, {}, 3)
        self.logger.log(level, msg, seconds, stacklevel=2)

    def _show(self, shown: Shown[_Said], kwargs: dict[str, Any], stacklevel: int) -> None:
        level, text, args = shown.line
        if shown.suppressed > 0:
            note = suppressed_note(shown.suppressed, shown.seconds)
            self.logger.log(level, text + " %s", *args, note, stacklevel=stacklevel, **kwargs)
        else:
            self.logger.log(level, text, *args, stacklevel=stacklevel, **kwargs)
