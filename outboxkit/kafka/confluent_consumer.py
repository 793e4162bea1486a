"""The sync consumer-group member on confluent-kafka (librdkafka).

librdkafka keeps an application-paused partition paused through an eager revoke and
re-assign; a partition paused for a retry whose hold was dropped at revocation would then
never move again. So every partition assigned is resumed right after the assignment.
A ``subscribe`` after ``close`` joins again with a new client.

librdkafka never answers an offset commit that was in flight when its broker went away (and
the client's later polls and its close then wait for it too, for ever): a commit is given the
group session's timeout and :data:`COMMIT_MARGIN_SECONDS` (a commit deferred while no coordinator
is known fails by itself at that timeout, so a coordinator's move never costs the client), and
past that the client is given up. It is closed in a thread nobody waits for, its partitions are
handed back as lost (nothing can be committed for them), and a new client subscribes at the next
poll. More than :data:`ABANDONED_MAX` given-up clients still open end the consumer with an error
(a supervisor's restart frees them). A close is given :data:`CLOSE_SECONDS`. A poll a stop cut
short is followed by a seek back (:mod:`outboxkit.kafka.confluent_positions`).
"""

from __future__ import annotations

import logging
import operator
import threading
import time
from collections.abc import Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from outboxkit.bounded import BoundedCaller, Unanswered, call_within
from outboxkit.errors import OutboxkitError, PublishError
from outboxkit.kafka.acl import RefusalNotice
from outboxkit.kafka.api import ConsumedRecord, GroupConsumer, Rebalance, Revoke, undecodable_name
from outboxkit.kafka.api import TopicPartition as TP
from outboxkit.kafka.config import CONSUMER_OPTIONS_HINT, confluent_config
from outboxkit.kafka.confluent_build import create
from outboxkit.kafka.confluent_log_bounds import log_bounds
from outboxkit.kafka.confluent_positions import FetchPositions, ready
from outboxkit.kafka.errors import with_credentials_hint
from outboxkit.kafka.group_protocol import CONFLUENT_DEFAULT_STRATEGY, ProtocolNotice
from outboxkit.settings import KafkaSettings

logger = logging.getLogger("outboxkit.kafka.consumer")

# A missing ACL: librdkafka says which kind, not what to grant (nor, for a fetch, the topic).
_REFUSED = (KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.GROUP_AUTHORIZATION_FAILED)

#: Seconds past the group session's timeout (``session.timeout.ms``, librdkafka's default 45 s)
#: an offset commit may take before its client is given up.
COMMIT_MARGIN_SECONDS = 5.0
_SESSION_TIMEOUT_MS = 45_000  # librdkafka's default
#: Given-up clients whose close has not ended yet, past which the consumer stops.
ABANDONED_MAX = 8
#: Seconds a close may take before its client is left to end on its own.
CLOSE_SECONDS = 10.0

_FORCED = {
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
    "isolation.level": "read_committed",
}


def _tps(partitions: list[TopicPartition]) -> list[TP]:
    return [(p.topic, p.partition) for p in partitions]


# ``Message.headers()`` decodes every name as UTF-8, and for a name that is not it returns a
# list holding a NULL with the UnicodeDecodeError still set. Called through the C API the
# interpreter turns that into a SystemError; a call straight from bytecode that CPython has
# specialised (a hot call site) skips that check and hands the broken list on. So it is only
# ever called through ``methodcaller``, once per message (a second call returns the same list).
_HEADERS = operator.methodcaller("headers")


def message_headers(msg: Message) -> tuple[tuple[tuple[str, bytes | None], ...], str | None]:
    """The message's headers, or why they cannot be read: then the record goes on without
    them, to be rejected by the inbox rather than crash the consumer on every restart."""
    try:
        headers: Any = _HEADERS(msg) or ()
    except (UnicodeDecodeError, SystemError) as exc:
        cause = exc if isinstance(exc, UnicodeDecodeError) else exc.__cause__ or exc.__context__
        if not isinstance(cause, UnicodeDecodeError):
            raise
        return (), undecodable_name(cause.object)
    return tuple(headers), None


def consumed_record(msg: Message) -> ConsumedRecord:
    """A fetched message as the client-neutral record (every confluent reader builds it here)."""
    ts_type, ts = msg.timestamp()
    headers, header_error = message_headers(msg)
    return ConsumedRecord(
        msg.topic() or "",
        msg.partition() or 0,
        msg.offset() or 0,
        msg.key(),
        msg.value(),
        headers,
        ts if ts_type else None,
        header_error,
    )


class ConfluentGroupConsumer(GroupConsumer):
    def __init__(
        self, settings: KafkaSettings, group_id: str, *, config: Mapping[str, Any] | None = None
    ) -> None:
        defaults: dict[str, Any] = {"auto.offset.reset": "earliest"}
        # The consumer's own options win over the shared properties; _FORCED over both.
        forced: dict[str, Any] = {"group.id": group_id, **_FORCED}
        self._config = confluent_config(settings, defaults, options=config, **forced)
        self._config["on_commit"] = self._revocation_committed
        # When the revocation's commit (not waited for) must have been answered by.
        self._revocation_deadline: float | None = None
        self._consumer = self._create()
        self._positions = FetchPositions()  # the client's: where a cut poll goes back to
        self._closed = False
        self._wedged = False  # a request went unanswered: replaced next poll, untouched till then
        self._topics: list[str] = []
        self._owned: set[TP] = set()  # what the callbacks were told is assigned
        self._abandoned: list[threading.Thread] = []  # closes of given-up clients
        self._committer = BoundedCaller("outboxkit-offset-commit")
        session = _number(self._config.get("session.timeout.ms"), _SESSION_TIMEOUT_MS)
        #: Seconds an offset commit may take before the client is given up (tests shorten it).
        self.commit_seconds = session / 1000 + COMMIT_MARGIN_SECONDS
        self._assigned_now: list[TopicPartition] = []
        self._notice = RefusalNotice(logger)
        strategy = self._config.get("partition.assignment.strategy", CONFLUENT_DEFAULT_STRATEGY)
        offered = [name.strip() for name in str(strategy).split(",") if name.strip()]
        self._protocol = ProtocolNotice(logger, "confluent-kafka", group_id, offered)
        self._on_assign: Rebalance = lambda tps: None
        self._on_revoke: Revoke = lambda tps: {}

    @property
    def offset_reset(self) -> str:
        policy = str(self._config.get("auto.offset.reset", "largest")).lower()  # its default
        return "earliest" if policy in ("smallest", "beginning") else policy

    def _create(self) -> Consumer:
        return create(
            Consumer,
            dict(self._config),
            "the Kafka consumer (confluent-kafka) cannot be created",
            CONSUMER_OPTIONS_HINT,
        )

    def subscribe(self, topics: list[str], on_assign: Rebalance, on_revoke: Revoke) -> None:
        """Join the group; after :meth:`close`, with a new client (the inbox replaces one that
        keeps refusing a seek: nothing of the old one's state is carried over)."""
        if self._closed:
            self._consumer, self._closed, self._assigned_now = self._create(), False, []
            self._wedged, self._owned, self._positions = False, set(), FetchPositions()
        self._on_assign, self._on_revoke, self._topics = on_assign, on_revoke, list(topics)
        self._join()

    def _join(self) -> None:
        self._consumer.subscribe(
            self._topics, on_assign=self._assigned, on_revoke=self._revoked, on_lost=self._lost
        )

    def _replace(self) -> None:
        """Give up a client whose commit went unanswered (or that keeps refusing the seek back
        after a cut poll: :data:`~outboxkit.kafka.confluent_positions.REWIND_ATTEMPTS`), and
        subscribe a new one (it starts from the committed offsets)."""
        old, lost, refused = self._consumer, sorted(self._owned), self._positions.stuck
        self._abandon(old)
        self._closed = True  # closing in its thread: nothing may close or use it again
        open_ = len(self._abandoned)
        if open_ > ABANDONED_MAX:
            raise OutboxkitError(
                f"{open_} Kafka consumer clients given up (an offset commit never answered) are"
                " still open; stopping so that a restart frees them"
            )
        self._consumer = self._create()  # if it fails, the consumer stays closed (and wedged)
        self._closed, self._wedged, self._owned, self._assigned_now = False, False, set(), []
        self._positions = FetchPositions()
        commit = f"an offset commit got no answer within {self.commit_seconds:g} s (the broker"
        logger.warning(
            "the Kafka consumer was replaced: %s; its partitions are taken as lost (%d given-up"
            " client(s) still closing)",
            "it kept refusing the seek back after a cut poll" if refused else f"{commit} left)",
            open_,
        )
        if lost:
            self._on_revoke(lost)  # not ours any more: nothing can be committed
        self._join()

    def _abandon(self, consumer: Consumer) -> None:
        """Close in a daemon thread nobody waits for (it may never end); counted while open."""
        closing = threading.Thread(
            target=_close_quietly,
            args=(consumer,),
            name="outboxkit-consumer-abandoned",
            daemon=True,
        )
        closing.start()
        self._abandoned = [t for t in self._abandoned if t.is_alive()] + [closing]

    # A closed, given-up or replaced client's callbacks (its close revokes) are not the inbox's
    # any more: it may be replacing the client, and took over what they would hand back.
    def _current(self, consumer: Any) -> bool:
        return not self._closed and not self._wedged and consumer is self._consumer

    def _assigned(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        self._positions.assigned(_tps(partitions))  # first: a stop later in here keeps it
        if not self._current(consumer):
            return
        self._owned.update(_tps(partitions))
        self._on_assign(_tps(partitions))
        # Resumed once the client has applied the assignment (after this callback returns).
        self._assigned_now.extend(partitions)

    def _revoked(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        if not self._current(consumer):
            return
        self._owned.difference_update(_tps(partitions))
        offsets = self._on_revoke(_tps(partitions))
        if offsets:
            # Not waited for: one from another thread is not answered while a rebalance callback
            # runs, and one waited for here would hold consume() for ever if its broker went
            # away with it in flight (librdkafka ends the revocation once its commits ended).
            # Its answer comes to _revocation_committed; none by the deadline: client given up.
            request = [TopicPartition(t, p, o) for (t, p), o in offsets.items()]
            try:
                self._consumer.commit(offsets=request, asynchronous=True)
            except KafkaException as exc:
                logger.warning("offset commit on revoke failed (redelivery is recognised): %s", exc)
            else:
                self._revocation_deadline = time.monotonic() + self.commit_seconds

    def _revocation_committed(self, error: Any, partitions: list[TopicPartition]) -> None:
        """librdkafka's answer to an asynchronous commit (served by consume())."""
        self._revocation_deadline = None
        failed = [p for p in partitions or () if p.error is not None]
        if error is not None or failed:
            why = error if error is not None else failed[0].error
            logger.warning("offset commit on revoke failed (redelivery is recognised): %s", why)

    def _lost(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        if not self._current(consumer):
            return
        self._owned.difference_update(_tps(partitions))
        self._on_revoke(_tps(partitions))  # not ours any more: nothing can be committed

    def poll(self, timeout: float, max_records: int) -> list[ConsumedRecord]:
        if self._closed and self._wedged:  # its replacement failed: nothing left to poll
            raise OutboxkitError("the Kafka consumer was given up and could not be replaced")
        if self._wedged:
            self._replace()
        if not ready(self._consumer, self._positions, self.committed, timeout):
            self._wedged = self._positions.stuck  # it keeps refusing a seek: replaced next poll
            return []  # the last poll was cut short and seeking back failed: tried again next
        # consume() waits until it has max_records or the timeout passed: wait for one record
        # only, then take what is already fetched without waiting.
        messages = self._consumer.consume(1, timeout)
        # After consume(), which serves the answer if it came (however long since the last poll).
        deadline = self._revocation_deadline
        if deadline is not None and time.monotonic() > deadline:
            self._wedged, self._revocation_deadline = True, None  # the revocation never ends
            return []  # what it fetched comes again to the new client (its partitions are lost)
        if messages and max_records > 1:
            messages += self._consumer.consume(max_records - 1, 0)
        if self._assigned_now:  # cleared once resumed: a stop in between resumes them again
            self._resume_assigned(self._assigned_now)
            self._assigned_now = []
        records = []
        for msg in messages:
            error = msg.error()
            if error is None:
                records.append(consumed_record(msg))
            elif error.fatal():
                raise OutboxkitError(f"Kafka consumer failed: {error}")
            elif error.code() == KafkaError.INCONSISTENT_GROUP_PROTOCOL:  # librdkafka asks again
                self._protocol.refused()
            elif error.code() in _REFUSED:
                where = f" on {msg.topic()!r}" if msg.topic() else ""
                self._notice.refused(f"{error}{where}")
            else:
                logger.warning("consumer error: %s", with_credentials_hint(str(error)))
        self._positions.ended(records)  # handed over: a stop before this line fetches them again
        return records

    def _resume_assigned(self, partitions: list[TopicPartition]) -> None:
        current = {(p.topic, p.partition) for p in self._consumer.assignment()}
        still = [p for p in partitions if (p.topic, p.partition) in current]
        if still:
            self._consumer.resume(still)

    def assignment(self) -> set[TP]:
        return set() if self._wedged else set(_tps(self._consumer.assignment()))

    def _only_assigned(self, partitions: list[TP]) -> list[TopicPartition]:
        current = self.assignment()
        return [TopicPartition(t, p) for t, p in partitions if (t, p) in current]

    def pause(self, partitions: list[TP]) -> None:
        found = self._only_assigned(partitions)  # none while wedged
        if found:
            self._consumer.pause(found)

    def resume(self, partitions: list[TP]) -> None:
        found = self._only_assigned(partitions)
        if found:
            self._consumer.resume(found)

    def seek(self, partition: TP, offset: int) -> bool:
        if partition not in self.assignment():
            return False
        try:
            self._consumer.seek(TopicPartition(*partition, offset))
        except KafkaException as exc:  # revoked meanwhile, or not fetching yet
            logger.info("seek of %s/%d to %d failed: %s", *partition, offset, exc)
            return False
        self._positions.sought(partition, offset)
        return True

    def commit(self, offsets: dict[TP, int]) -> None:
        """In a thread of its own, given :attr:`commit_seconds` (never from a rebalance
        callback: see :meth:`_revoked`)."""
        if not offsets:
            return
        if self._wedged:
            raise PublishError("offset commit failed: the client is being replaced")
        request = [TopicPartition(t, p, o) for (t, p), o in offsets.items()]
        consumer = self._consumer

        def call() -> list[TopicPartition] | None:
            return consumer.commit(offsets=request, asynchronous=False)

        try:
            result = self._committer(call, self.commit_seconds)
        except KafkaException as exc:
            raise PublishError(f"offset commit failed: {exc.args[0]}") from exc
        except Unanswered as exc:
            self._wedged = True
            raise PublishError(
                f"offset commit failed: no answer within {self.commit_seconds:g} s; the client"
                " is replaced"
            ) from exc
        failed = [p for p in result or () if p.error is not None]
        if failed:
            raise PublishError(f"offset commit failed: {failed[0].error}")

    def committed(self, partitions: list[TP], timeout: float) -> dict[TP, int]:
        if not partitions:
            return {}
        if self._wedged:
            raise PublishError("reading the committed offsets failed: the client is being replaced")
        try:
            found = self._consumer.committed([TopicPartition(*tp) for tp in partitions], timeout)
        except (KafkaException, RuntimeError) as exc:  # RuntimeError: the client is closed
            raise PublishError(f"reading the committed offsets failed: {exc.args[0]}") from exc
        failed = [p for p in found if p.error is not None]
        if failed:
            raise PublishError(f"reading the committed offsets failed: {failed[0].error}")
        return {(p.topic, p.partition): p.offset for p in found if p.offset >= 0}

    def log_bounds(self, partition: TP, timeout: float) -> tuple[int, int]:
        if not self._wedged:  # a client being given up is not asked: it may never answer
            try:
                return log_bounds(self._consumer, partition, timeout)
            except Unanswered:  # held by an unanswered request: given up, as after a commit
                self._wedged = True
        raise PublishError("reading the log's bounds failed: the client is being replaced")

    def close(self) -> None:
        if self._closed:
            return  # closed, or closing in a thread of its own: never a second close
        self._closed = True
        if self._wedged:
            self._abandon(self._consumer)  # its close would wait for the unanswered commit
            return
        try:
            call_within(self._consumer.close, CLOSE_SECONDS, "outboxkit-consumer-close")
        except Unanswered:
            logger.warning(
                "the Kafka consumer did not close within %g s; it is left to end on its own",
                CLOSE_SECONDS,
            )
        except (KafkaException, RuntimeError) as exc:
            logger.info("consumer close: %s", exc)


def _number(value: Any, default: float) -> float:
    """A numeric option as librdkafka read it ("1e4" too), else its default."""
    try:
        return float(value) if value is not None else default
    except (TypeError, ValueError):
        return default


def _close_quietly(consumer: Consumer) -> None:
    try:
        consumer.close()
    except (KafkaException, RuntimeError) as exc:
        logger.info("consumer close: %s", exc)


__all__ = ["ConfluentGroupConsumer"]
