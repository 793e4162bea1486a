"""A transaction's checkpoint record, and what a checkpoint too large for its topic does.

A checkpoint lists every row of its transaction (about 50 bytes a row: ~250 KB for 5,000 rows),
so a checkpoint topic whose ``max.message.bytes`` is below that refuses every full transaction,
and retrying the same transaction cannot help. Instead the transaction is aborted (nothing of
it is marked, so it is retried whole and in order, exactly once) and the shard's transactions
are capped at half the refused rows, again until a checkpoint fits. A one-row checkpoint that
does not fit is a configuration error: said as such, and retried with back-off, never hot.

The cap is tried higher again a minute after the last halving, while transactions fill it (twice
as many rows, at most what the settings allow), so raising the topic's limit takes effect
without a restart; while the limit stays low, that costs one aborted transaction a minute.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence

from outboxkit.errors import PublishError
from outboxkit.kafka.api import ProduceRequest, RecordError, TransactionalProducer
from outboxkit.kafka.errors import ErrorKind
from outboxkit.relay.checkpoint import Checkpoint, CheckpointTopic
from outboxkit.relay.claim_size import ClaimSizer
from outboxkit.relay.lease import LeaseTerm
from outboxkit.settings import RelaySettings

logger = logging.getLogger("outboxkit.relay.shard_worker")

# Seconds after the last halving before transactions are tried twice as large again.
CAP_PROBE_SECONDS = 60.0


def too_large(error: RecordError) -> bool:
    """A refusal for size, by the broker or by the client itself (both clients' names)."""
    return error.kind is ErrorKind.PERMANENT and "TOOLARGE" in error.name.upper().replace("_", "")


class CheckpointWriter:
    """One shard's checkpoints (exactly-once only; without a topic it writes nothing)."""

    def __init__(
        self,
        config: RelaySettings,
        shard: int,
        checkpoints: CheckpointTopic | None,
        sizer: ClaimSizer,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._config = config
        self._shard = shard
        self._checkpoints = checkpoints
        self._sizer = sizer
        self._clock = clock
        self._capped_at: float | None = None  # when the last halving was
        self._seq = 0  # checkpoint commit order within a term (never reset: lives share a term)
        self._last: tuple[Checkpoint, int] | None = None  # the last one built, and its bytes
        self._told = False  # the size refusal is explained once per shard, not at every halving

    def records(
        self, term: LeaseTerm, slot: int, rows: Sequence[tuple[int, str]]
    ) -> list[ProduceRequest]:
        """The transaction's checkpoint record: every row it carries."""
        if self._checkpoints is None:
            return []
        self._probe()
        group = self._config.group
        checkpoint = Checkpoint(group, self._shard, term.token, tuple(rows), slot, self._seq)
        self._seq += 1
        request = self._checkpoints.request(checkpoint)
        self._last = (checkpoint, len(request.value) + len(request.key or b""))
        return [request]

    def _probe(self) -> None:
        """A minute after the last halving, and while transactions fill the cap (a quiet shard
        tests nothing), let the next ones be twice as large."""
        if self._capped_at is None or self._clock() - self._capped_at < CAP_PROBE_SECONDS:
            return
        if self._last is None or len(self._last[0].rows) < self._sizer.max_rows:
            return
        self._sizer.cap(self._sizer.max_rows * 2)
        self._capped_at = self._clock() if self._sizer.capped else None
        self._told = self._sizer.capped  # a later refusal is a new story: told again
        level = logging.DEBUG if self._sizer.capped else logging.INFO
        logger.log(
            level,
            "shard %s: transactions of up to %d rows are tried again%s",
            self._shard,
            self._sizer.max_rows,
            "" if self._sizer.capped else " (as the settings allow: the checkpoint fits again)",
        )

    async def send_alone(
        self,
        term: LeaseTerm,
        producer: TransactionalProducer,
        slot: int,
        rows: Sequence[tuple[int, str]],
    ) -> RecordError | None:
        """The checkpoint sent after the transaction's last claim went out; its error, if any."""
        requests = self.records(term, slot, rows)
        if not requests:
            return None
        deliveries = await producer.send(requests)
        term.check()
        return deliveries[0].error

    def refused(self, error: RecordError) -> None:
        """The last checkpoint failed with ``error``: returns once the shard's transactions are
        capped (too large: the caller aborts and retries at once); raises ``PublishError``
        otherwise (the caller backs off)."""
        if not too_large(error):
            raise PublishError(f"checkpoint record failed: {error}")
        assert self._checkpoints is not None, "exactly-once only"
        assert self._last is not None, "a checkpoint was sent"
        checkpoint, size = self._last
        rows, topic = len(checkpoint.rows), self._checkpoints.topic
        # What does not grow with the rows (token, key, ...), for the size of a full one.
        empty = (
            size - len(checkpoint.encode()) + len(dataclasses.replace(checkpoint, rows=()).encode())
        )
        limit = (
            "the producer's own limit (message.max.bytes in [kafka.properties])"
            if error.local
            else f"max.message.bytes of the checkpoint topic {topic}"
        )
        if rows <= 1:
            raise PublishError(
                f"even a one-row checkpoint ({size} bytes) is larger than"
                f" {limit} ({error}); nothing is published until it is raised (then its"
                " transactions grow back to full size, doubling each minute)"
            )
        self._sizer.cap(rows // 2)
        self._capped_at = self._clock()
        level = logging.DEBUG if self._told else logging.WARNING
        self._told = True
        full = self._config.transaction_max_rows
        logger.log(
            level,
            "shard %s: a checkpoint of %d rows (%d bytes) is larger than %s (%s): the"
            " transaction is aborted and retried at once with at most %d rows, halved again"
            " until its checkpoint fits (and tried twice as large each minute, so a raised"
            " limit takes effect without a restart); a transaction of transaction_max_rows ="
            " %d rows needs about %d bytes",
            self._shard,
            rows,
            size,
            limit,
            error,
            rows // 2,
            full,
            empty + (size - empty) * full // rows,
        )
