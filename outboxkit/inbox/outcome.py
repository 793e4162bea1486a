"""How one delivery ended, as the adapters act on it (commit the offset, retry, or leave it)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import NamedTuple

from outboxkit.inbox.frozen import build


class OutcomeKind(enum.Enum):
    SUCCEEDED = "succeeded"
    DUPLICATE = "duplicate"  # already terminal: skipped, duplicate_count + 1
    REJECTED = "rejected"  # undecodable / unknown type / no event id / reused id: recorded
    DEAD = "dead"  # retries exhausted: recorded, sent to the dead-letter topic
    CANCELLED = "cancelled"  # an operator cancelled it; the handler's writes were rolled back
    RETRY = "retry"  # the handler failed; run it again after ``retry_in`` seconds
    LEASE_LOST = "lease_lost"  # fenced by a newer claim or the partition was revoked

    @property
    def advances_offset(self) -> bool:
        """Whether the offset may be committed past this message (asked twice an event: by
        identity, as reading the members through the class costs more than the test)."""
        return self is not _RETRY and self is not _LEASE_LOST


_RETRY, _LEASE_LOST = OutcomeKind.RETRY, OutcomeKind.LEASE_LOST


class Recorded(NamedTuple):
    """A duplicate's event as its row records it: what its acknowledgement says again."""

    state: str
    attempts: int
    error: str | None


@dataclass(frozen=True)
class Outcome:
    kind: OutcomeKind
    event_id: str | None
    attempts: int = 0
    error: str | None = None
    retry_in: float = 0.0
    # Something an operator must hear about although the record ended: "dead_letter_failed"
    # (the event is dead without a dead-letter record) or "given_up" (unexpected errors).
    alert: str | None = None
    # Recorded in the rejection log (``inbox_rejection``), not on the event's own row: ``kind``
    # says how this delivery ended, not the event (a reused id's original row is untouched).
    # Neither flag is compared: an outcome equals one built without them, as before they were.
    rejection_log: bool = field(default=False, compare=False)
    # A delivery given up (``alert="given_up"``) whose unfinished row was marked ``dead``: the
    # event itself is dead, which is what its acknowledgement says (see ``acks.py``).
    row_dead: bool = field(default=False, compare=False)
    # A ``DUPLICATE``: the event's outcome as recorded, acknowledged again (the delivery that
    # finished it may have died before acknowledging it). Not in ``attempts``/``error``: a
    # duplicate's outcome equals ``Outcome(DUPLICATE, event_id)``, as it always did.
    recorded: Recorded | None = field(default=None, compare=False)

    @classmethod
    def succeeded(cls, event_id: str, attempts: int) -> Outcome:
        """``SUCCEEDED`` (built field by field for less: one per event of a batch)."""
        return build(
            cls,
            kind=OutcomeKind.SUCCEEDED,
            event_id=event_id,
            attempts=attempts,
            error=None,
            retry_in=0.0,
            alert=None,
            rejection_log=False,
            row_dead=False,
            recorded=None,
        )
