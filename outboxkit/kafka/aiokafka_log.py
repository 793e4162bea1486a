"""aiokafka's own log lines, rate-limited.

aiokafka logs through ``logging``, under loggers named after its modules (``aiokafka``,
``aiokafka.consumer.fetcher``, ...). While a broker is away a consumer logs about sixty ERROR
lines a second (every 100 ms: the failed connection, the metadata update, the coordinator
request, the fetch), for as long as the outage lasts. :class:`AiokafkaLogLimit`, a filter on
each of those loggers, shows what :class:`~outboxkit.kafka.log_limit.RepeatLimit` lets
through: the first line of a kind at once, its repeats counted and shown with the first one
after a window (``log_limit.py`` says how). Lines are grouped by logger, level and text (its
varying parts normalised); aiokafka's lines do not name the client, so two clients that fail
alike share a count. DEBUG lines were asked for: they pass unlimited.
"""

from __future__ import annotations

import logging
import threading

from outboxkit.kafka.log_limit import RepeatLimit, Shown, normalised, suppressed_note

_ROOT = "aiokafka"
# Set on a line shown later than it came (a count that was pending): decided on already.
_DECIDED = "_outboxkit_log_limit"


class AiokafkaLogLimit(logging.Filter):
    """One limit shared by every aiokafka logger it is installed on. It never raises: a line
    that cannot be grouped is shown as it came."""

    def __init__(self, limit: RepeatLimit[logging.LogRecord] | None = None) -> None:
        super().__init__()
        self.limit: RepeatLimit[logging.LogRecord] = RepeatLimit() if limit is None else limit

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno <= logging.DEBUG or getattr(record, _DECIDED, False):
            return True
        try:
            key = (record.name, record.levelno, normalised(record.getMessage()))
            decided = self.limit.admit(key, record)
        except Exception:
            return True
        passed = False
        for shown in decided:
            _count_in(shown)
            if shown.line is record:
                passed = True
            else:  # an earlier line, kept back, with the count of its group: shown now
                setattr(shown.line, _DECIDED, True)
                logging.getLogger(shown.line.name).handle(shown.line)
        return passed


def _count_in(shown: Shown[logging.LogRecord]) -> None:
    """The line's text with the number of its group's lines not shown, if any."""
    if shown.suppressed > 0:
        record = shown.line
        note = suppressed_note(shown.suppressed, shown.seconds)
        record.msg, record.args = f"{record.getMessage()} {note}", None


_SHARED = AiokafkaLogLimit()
_lock = threading.Lock()


def limit_aiokafka_log() -> None:
    """Install the shared filter on every aiokafka logger there is (last among each one's
    filters, so it counts the lines as the others left them). Idempotent; called whenever an
    aiokafka client's options are built, when aiokafka's modules are imported."""
    with _lock:
        manager = logging.Logger.manager
        names = [_ROOT] + [n for n in list(manager.loggerDict) if n.startswith(_ROOT + ".")]
        for name in names:
            found = logging.getLogger(name)
            if _SHARED not in found.filters:
                found.addFilter(_SHARED)
