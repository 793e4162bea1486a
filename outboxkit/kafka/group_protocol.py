"""The refusal of a join for want of a shared assignment strategy, said the same way for both
clients.

A group may mix confluent-kafka and aiokafka members (a migration's rolling deploy) only while
every member offers one strategy in common: the broker refuses a joining member that shares
none with the members already in the group (``INCONSISTENT_GROUP_PROTOCOL``). librdkafka only
logs that and tries again for ever, aiokafka names the error class alone; neither says what to
change. The refusal lasts only while such a member stays: a rolling deploy that changes the
strategy, or a member that crashed (in the group until its session times out). So the consumer
is never ended for it (a supervisor would restart it into the same refusal, and stop trying
once its restart budget is spent, long before the group heals): it waits, and says why once
every :data:`~outboxkit.kafka.acl.NOTICE_INTERVAL`, as for a missing ACL.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any

from outboxkit.errors import GroupProtocolError
from outboxkit.kafka.acl import NOTICE_INTERVAL, Clock

#: librdkafka's default ``partition.assignment.strategy`` (its versions 1.x and 2.x).
CONFLUENT_DEFAULT_STRATEGY = "range,roundrobin"


def refusal_text(client: str, group: str, offered: Iterable[str]) -> str:
    """What a member of ``group`` on ``client`` offering ``offered`` is told."""
    mine = ", ".join(offered) or "none"
    return (
        f"Kafka refused the consumer ({client}) a place in group {group!r}: none of the"
        f" partition assignment strategies it offers ({mine}) is offered by every member"
        " already in the group, or the group id is used by another kind of client"
        " (INCONSISTENT_GROUP_PROTOCOL). Every member of a group needs one strategy in common:"
        f" confluent-kafka's default (partition.assignment.strategy {CONFLUENT_DEFAULT_STRATEGY})"
        " and aiokafka's (roundrobin) share roundrobin; cooperative-sticky shares nothing with"
        " aiokafka or an eager strategy. Align the strategies (aiokafka's"
        " partition_assignment_strategy takes assignor classes, so with `outboxkit inbox run`"
        " align the confluent-kafka members), or stop the other members first. The consumer"
        " waits meanwhile: it joins once no such member is left (a member that crashed stays"
        " in the group until its session times out)"
    )


class ProtocolNotice:
    """A member refused its join is polled again and again while librdkafka or aiokafka keeps
    asking: the refusal is logged once, and again every ``NOTICE_INTERVAL`` while it lasts.
    ``offered``: the member's strategies (names, or aiokafka's assignor classes)."""

    def __init__(
        self,
        logger: logging.Logger,
        client: str,
        group: str,
        offered: Iterable[Any],
        clock: Clock = time.monotonic,
    ) -> None:
        self._logger, self._clock = logger, clock
        names = [str(getattr(strategy, "name", strategy)) for strategy in offered]
        self._text = refusal_text(client, group, names)
        self._said: float | None = None

    def error(self, *, starting: bool = False) -> GroupProtocolError:
        """The typed error, for a refusal that is raised (``starting``: said as the other failed
        starts are)."""
        prefix = "Kafka consumer could not start: " if starting else ""
        return GroupProtocolError(prefix + self._text)

    def refused(self) -> None:
        now = self._clock()
        if self._said is not None and now - self._said < NOTICE_INTERVAL:
            return
        self._said = now
        self._logger.warning("%s", self._text)


__all__ = ["CONFLUENT_DEFAULT_STRATEGY", "ProtocolNotice", "refusal_text"]
