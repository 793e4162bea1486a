"""Resuming partitions whose retry is due: seek back to the held record, or to the start of a
log that replaced the one the hold refers to (sans-IO).

Before the seek the partition's log bounds are read from the broker (retries are rare: one
round trip each). An end at or below the held offset means the held record's log is gone as a
whole: high watermarks never go back (Kafka keeps the offsets it lists monotonic across leader
changes, KIP-207) but for a topic deleted and created again under the same name, or an unclean
truncation. The new log is then read from its start, none of it having run here, and the held
record ends as gone (:mod:`.gate`). Bounds that cannot be read (or read as no log's: negative,
or a start past the end) leave the seek back as before: the gate still finds a replaced log that
grew past the held offset by the record the seek delivers there.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from outboxkit.errors import PublishError
from outboxkit.inbox.gate import without
from outboxkit.inbox.steps import LogBounds, Plan, Resume, Seek

if TYPE_CHECKING:
    from outboxkit.inbox.loop import ConsumerLoop

logger = logging.getLogger("outboxkit.inbox.consumer")

#: How long reading a held partition's log bounds may take before the seek goes on without.
BOUNDS_READ_SECONDS = 5.0


def resume_due(loop: ConsumerLoop, now: float) -> Plan[bool]:
    """Seek and resume the held partitions whose back-off ran out; whether a client that keeps
    refusing the seek back should be replaced."""
    rejoin = False
    for tp, offset in loop.gate.due(now):
        hold = loop.gate.get(tp)
        if tp not in loop.assigned or hold is None:
            continue
        loop.buffer = without(loop.buffer, {tp})  # predates the seek, which delivers it again
        bounds = yield from _bounds(tp)
        end = None if bounds is None else bounds[1]
        restart = hold.rewind or (end is not None and offset >= end)
        # A rewind whose bounds cannot be read goes to offset 0: the client takes a log that
        # starts later to its start (auto.offset.reset, earliest by default).
        target = (0 if bounds is None else bounds[0]) if restart else offset
        if (yield Seek(tp, target)):
            if restart:
                loop.gate.restart(tp, target, end)
            else:
                loop.gate.sought(tp)
            yield Resume([tp])
        else:  # resumed, it would go on past the held record, which would be skipped
            rejoin = loop.gate.seek_failed(tp, now) or rejoin
    return rejoin


def _bounds(tp: tuple[str, int]) -> Plan[tuple[int, int] | None]:
    """``(start, end)``, or ``None`` if not read (an executor without the step answers
    something else, or a client a value that no log has: taken as not read too, as an end
    taken for one at or below the held offset would end a live record's row)."""
    try:
        bounds: object = yield LogBounds(tp, BOUNDS_READ_SECONDS)
    except PublishError as exc:
        logger.info("%s/%d: %s; seeking back to the held record all the same", *tp, exc)
        return None
    match bounds:
        case (int() as start, int() as end) if 0 <= start <= end:
            return start, end
        case (int(), int()):  # a logical offset (-1, -1001...) or a start past the end
            logger.info("%s/%d: the log's bounds read as %r; taken as not read", *tp, bounds)
    return None
