"""``deliver_after`` as the instant it names, in UTC, its tzinfo asked once.

A datetime's tzinfo is the caller's code: its ``utcoffset`` may raise, answer something that is
not an offset, or answer differently when asked again, and psycopg takes a tzinfo that is false
as a truth value for none (the INSERT then failed with a bare TypeError). So the offset is read
here, once, where a failure is a ValidationError naming the field; the row then carries a plain
datetime in UTC, which every path sends as is, and no tzinfo of the caller's is asked again.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

from outboxkit.errors import ValidationError

_DAY = timedelta(days=1)
# PostgreSQL reads a text offset up to 15:59:59, in whole seconds: the COPY sends text.
_PG_OFFSET = timedelta(hours=16)
_SECOND = timedelta(seconds=1)


def _kind(value: object) -> str:
    kind = type(value).__name__
    return f"{kind} ({len(value)} characters)" if isinstance(value, str) else kind


def _naive(value: object) -> ValidationError:
    return ValidationError(
        "deliver_after must be a timezone-aware datetime (a naive one would be read in"
        f" the database session's time zone), got {_kind(value)}"
        + (" without a time zone" if isinstance(value, datetime) else "")
    )


def utc_instant(when: object) -> datetime:
    """``when`` as a plain datetime in UTC, or a ValidationError naming ``deliver_after`` (its
    type, never its value). Within a day of datetime's range, where Python has no UTC form, it
    keeps its local time with the offset as a fixed ``timezone``, if PostgreSQL reads that."""
    if type(when) is datetime and when.tzinfo is UTC:
        return when  # the usual one: datetime.now(UTC) + a delay
    if not isinstance(when, datetime):
        raise _naive(when)
    try:
        offset = when.utcoffset()
        local = datetime(
            when.year, when.month, when.day, when.hour, when.minute, when.second, when.microsecond
        )
    except Exception as exc:  # the caller's tzinfo (or datetime subclass) failed
        raise ValidationError(
            f"deliver_after refused: its tzinfo ({type(when.tzinfo).__name__}) gave no valid"
            f" UTC offset ({type(exc).__name__})"
        ) from exc
    if offset is None:
        raise _naive(when)
    if not isinstance(offset, timedelta) or not -_DAY < offset < _DAY:  # a subclass's answer
        raise ValidationError(
            f"deliver_after refused: its UTC offset is a {type(offset).__name__}, not a"
            " timedelta strictly within a day"
        )
    try:
        return (local - offset).replace(tzinfo=UTC)
    except OverflowError:
        pass
    if offset % _SECOND or abs(offset) >= _PG_OFFSET:
        raise ValidationError(
            "deliver_after refused: within a day of the end of datetime's range Python has no"
            " UTC form of it, and its UTC offset (beyond 15:59, or with a fraction of a second)"
            " is one PostgreSQL cannot read"
        )
    return local.replace(tzinfo=timezone(offset))
