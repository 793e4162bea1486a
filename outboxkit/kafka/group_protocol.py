"""The refusal of a join for want of a shared assignment strategy, said the same way for both
clients.

A group may mix confluent-kafka and aiokafka members (a migration's rolling deploy) only while
every member offers one strategy in common: the broker refuses a joining member that shares
none with the members already in the group (``INCONSISTENT_GROUP_PROTOCOL``). librdkafka only
logs that and tries again for ever, aiokafka names the error class alone; neither says what to
change.
"""

from __future__ import annotations

from collections.abc import Iterable

from outboxkit.errors import GroupProtocolError

#: librdkafka's default ``partition.assignment.strategy`` (its versions 1.x and 2.x).
CONFLUENT_DEFAULT_STRATEGY = "range,roundrobin"


def group_protocol_refused(
    client: str, group: str, offered: Iterable[str], *, starting: bool = False
) -> GroupProtocolError:
    """The typed error for a member of ``group`` on ``client`` offering ``offered``
    (``starting``: refused in its start, said as the other failed starts are)."""
    mine = ", ".join(offered) or "none"
    return GroupProtocolError(
        ("Kafka consumer could not start: " if starting else "")
        + f"Kafka refused the consumer ({client}) a place in group {group!r}: none of the"
        f" partition assignment strategies it offers ({mine}) is offered by every member"
        " already in the group (INCONSISTENT_GROUP_PROTOCOL). Every member of a group needs one"
        " in common: confluent-kafka's default (partition.assignment.strategy"
        f" {CONFLUENT_DEFAULT_STRATEGY}) and aiokafka's (roundrobin) share roundrobin;"
        " cooperative-sticky shares nothing with aiokafka or an eager strategy. Align"
        " partition.assignment.strategy / partition_assignment_strategy on every member, or"
        " stop the other members first (a member that crashed stays in the group until its"
        " session times out)"
    )


__all__ = ["CONFLUENT_DEFAULT_STRATEGY", "group_protocol_refused"]
