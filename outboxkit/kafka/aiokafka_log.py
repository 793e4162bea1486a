"""aiokafka's own log lines, rate-limited.

aiokafka logs through ``logging``, under loggers named after its modules (``aiokafka``,
``aiokafka.consumer.fetcher``, ...). While a broker is away a consumer logs about sixty ERROR
lines a second (every 100 ms: the failed connection, the metadata update, the coordinator
request, the fetch), for as long as the outage lasts. :class:`AiokafkaLogLimit`, a filter on
each of those loggers, shows what :class:`~outboxkit.log_limit.RepeatLimit` lets
through: the first line of a kind at once, its repeats counted and shown with the first one
after a window (``log_limit.py`` says how). Lines are grouped by logger, level, format and
arguments (their varying parts normalised; a list of broker ids in any order is one); aiokafka's
lines do not name the client, so two clients that fail alike share a count. DEBUG lines were
asked for: they pass unlimited. Every line has the clients' secret values masked
(:mod:`outboxkit.kafka.log_secrets`).
"""

from __future__ import annotations

import copy
import logging
import threading
from collections.abc import Iterable

from outboxkit.kafka.log_secrets import SecretMask
from outboxkit.log_limit import RepeatLimit, Shown, normalised, suppressed_note

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
        if getattr(record, _DECIDED, False):
            return True
        _mask_secrets(record)
        if record.levelno <= logging.DEBUG:
            return True
        try:
            held = _frozen(record)
            decided = self.limit.admit(_key(record), held)
        except Exception:
            return True
        passed = False
        for shown in decided:
            if shown.line is held:
                _count_in(record, shown)
                passed = True
            else:  # an earlier line, kept back, with the count of its group: shown now
                _count_in(shown.line, shown)
                setattr(shown.line, _DECIDED, True)
                logging.getLogger(shown.line.name).handle(shown.line)
        return passed


def _key(record: logging.LogRecord) -> tuple[object, ...]:
    """The group of a line: its logger, level, format and arguments, normalised. aiokafka names
    a cluster's brokers in a new random order at each metadata update: a list is a set here."""
    args = record.args
    if isinstance(args, tuple):
        parts: tuple[object, ...] = tuple(_arg(value) for value in args)
    elif args:  # a mapping, for "%(name)s" formats
        parts = tuple(sorted((str(name), _arg(value)) for name, value in args.items()))
    else:
        parts = ()
    return (record.name, record.levelno, normalised(str(record.msg)), parts)


def _arg(value: object) -> str:
    if isinstance(value, list | tuple | set | frozenset):
        return "[" + ", ".join(sorted(normalised(str(item)) for item in value)) + "]"
    if isinstance(value, BaseException):  # two errors without a message are still two kinds
        return f"{type(value).__name__}: {normalised(str(value))}"
    return normalised(str(value))


def _frozen(record: logging.LogRecord) -> logging.LogRecord:
    """A copy of the line to keep until its count is shown: its text rendered, its traceback
    as text, so what the line's arguments and traceback reference (a closed client, fetched
    buffers) is not kept alive by the limit. Raises for a line that cannot be formatted."""
    held = copy.copy(record)
    held.msg, held.args = record.getMessage(), None
    if record.exc_info:
        held.exc_text = record.exc_text or logging.Formatter().formatException(record.exc_info)
        held.exc_info = None
    return held


def _count_in(record: logging.LogRecord, shown: Shown[logging.LogRecord]) -> None:
    """The line's text with the number of its group's lines not shown, if any."""
    if shown.suppressed > 0:
        note = suppressed_note(shown.suppressed, shown.seconds)
        record.msg, record.args = f"{record.getMessage()} {note}", None


def _mask_secrets(record: logging.LogRecord) -> None:
    """The line without the secrets of any aiokafka client of this process (a DEBUG line shows
    a SASL PLAIN login's bytes); never raises."""
    try:
        text = record.getMessage()
        masked = _SECRETS.masked(text)
        trace = record.exc_text or (
            logging.Formatter().formatException(record.exc_info) if record.exc_info else ""
        )
        masked_trace = _SECRETS.masked(trace)
    except Exception:
        return
    if masked != text:
        record.msg, record.args = masked, None
    if masked_trace != trace:
        record.exc_text, record.exc_info = masked_trace, None


_SHARED = AiokafkaLogLimit()
_SECRETS = SecretMask()
_lock = threading.Lock()


def limit_aiokafka_log(secrets: Iterable[tuple[str, str]] = ()) -> None:
    """Install the shared filter on every aiokafka logger there is (last among each one's
    filters, so it counts the lines as the others left them), masking ``secrets`` (``(setting,
    value)`` pairs, :mod:`.log_secrets`) from now on. aiokafka's lines do not tell which client
    logged them, so every client's secrets are masked in every line. Idempotent; called whenever
    an aiokafka client's options are built, by when the modules that log have been imported."""
    _SECRETS.add(secrets)
    with _lock:
        manager = logging.Logger.manager
        names = [_ROOT] + [n for n in list(manager.loggerDict) if n.startswith(_ROOT + ".")]
        for name in names:
            found = logging.getLogger(name)
            if found.filters[-1:] != [_SHARED]:  # missing, or a filter was added after it
                found.removeFilter(_SHARED)
                found.addFilter(_SHARED)
