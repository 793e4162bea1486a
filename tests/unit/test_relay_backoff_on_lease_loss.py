"""A shard whose terms end at once does not spin through lease attempts.

Every lease attempt succeeds, and every term is lost at once (as when the producer's
``init_transactions`` kept failing as fenced): the worker backs off like after a failure. A term
that published something still goes back to standby at once (a successor may be ready).
A refused transactional.id is not fencing at all: a retried error that names the missing ACL.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from typing import Any

import pytest

from outboxkit.errors import ProducerFencedError, PublishError
from outboxkit.kafka.errors import TRANSACTIONAL_ID_ACL_HINT, ErrorKind, classify, with_acl_hint
from outboxkit.relay import shard_worker as shard_worker_module
from outboxkit.relay.lease import LeaseTerm
from outboxkit.relay.lease_loss import LeaseLoss
from outboxkit.relay.shard_worker import ShardWorker
from outboxkit.settings import load_settings
from tests.relay_support import shard_worker

pytestmark = pytest.mark.unit

GUARD = 10.0


class _LostAtOnce:
    """Process leases whose every attempt succeeds with a term that is already lost."""

    def __init__(self, enough: int) -> None:
        self.attempts = 0
        self.enough = enough
        self.reached = asyncio.Event()  # set at the ``enough``-th attempt

    async def acquire(
        self,
        group: str,
        shard: int,
        holder: str,
        ttl: float,
        wake: asyncio.Event,
        *,
        level: int = logging.INFO,
    ) -> LeaseTerm:
        await asyncio.sleep(0)  # a real attempt is a round trip: the loop runs meanwhile
        self.attempts += 1
        if self.attempts >= self.enough:
            self.reached.set()
        term = LeaseTerm(group, shard, holder, self.attempts, ttl, time.monotonic() + ttl)
        term.mark_lost("taken over right after the attempt", LeaseLoss.TAKEN_OVER)
        return term

    async def watch(self, term: LeaseTerm) -> None:
        await asyncio.Event().wait()  # the renewer: cancelled when the term ends

    async def release(self, term: LeaseTerm, *, level: int = logging.INFO) -> None:
        return None

    async def close(self) -> None:
        return None


def _worker(leases: _LostAtOnce, **relay: Any) -> ShardWorker:
    settings = load_settings(
        overrides={"database": {"url": "postgresql://relay@127.0.0.1:1/outbox"}, "relay": relay}
    )
    worker = shard_worker(settings, leases=leases)  # type: ignore[arg-type]
    worker._connect = contextlib.nullcontext  # type: ignore[method-assign,assignment]
    return worker


class _Waits:
    """Stands in for the worker's ``wait_any``: records each wait's length, returns at once."""

    def __init__(self) -> None:
        self.seconds: list[float] = []

    async def __call__(self, events: Sequence[asyncio.Event], seconds: float) -> None:
        self.seconds.append(seconds)
        await asyncio.sleep(0)


@pytest.fixture
def waits(monkeypatch: pytest.MonkeyPatch) -> _Waits:
    recorded = _Waits()
    monkeypatch.setattr(shard_worker_module, "wait_any", recorded)
    return recorded


async def _run_until_reached(worker: ShardWorker, leases: _LostAtOnce) -> None:
    """Run the worker until the ``enough``-th lease attempt, then stop it."""
    task = asyncio.create_task(worker.run())
    try:
        await asyncio.wait_for(leases.reached.wait(), GUARD)
    finally:
        worker.stop.set()
        await asyncio.wait_for(task, GUARD)


async def test_terms_lost_at_once_back_off_like_failures(waits: _Waits) -> None:
    leases = _LostAtOnce(enough=5)
    worker = _worker(leases, backoff_initial=0.05, backoff_max=1.0)
    await _run_until_reached(worker, leases)
    # A back-off before every next attempt, growing like after failures: each wait in
    # [base/2, base] for the bases 0.05, 0.1, 0.2, 0.4, ...
    assert len(waits.seconds) >= leases.attempts - 1 >= 4
    for n, seconds in enumerate(waits.seconds[:4]):
        base = 0.05 * 2**n
        assert base / 2 <= seconds <= base, waits.seconds
    assert worker.lease_lost_count == leases.attempts


async def test_a_term_that_published_goes_back_to_standby_at_once(waits: _Waits) -> None:
    """Twenty terms in a row whose marks committed: not one back-off wait between them."""
    leases = _LostAtOnce(enough=20)
    worker = _worker(leases, backoff_initial=5.0, backoff_max=5.0)

    async def publishes_then_loses(term: LeaseTerm, conn: object) -> None:
        worker._publisher.stats.marks += 1  # one mark committed in this term
        term.check()  # then the loss is seen

    worker._active_term = publishes_then_loses  # type: ignore[method-assign]
    await _run_until_reached(worker, leases)
    assert waits.seconds == []
    assert worker.lease_lost_count >= 20


def test_a_refused_transactional_id_is_retried_with_the_acl_named_not_fenced() -> None:
    pytest.importorskip("confluent_kafka")
    from confluent_kafka import KafkaError, KafkaException

    from outboxkit.kafka.confluent_producer import raise_for

    for name in ("TRANSACTIONAL_ID_AUTHORIZATION_FAILED", "TransactionalIdAuthorizationFailed"):
        assert classify(name) is ErrorKind.RETRIABLE
    refused = KafkaException(
        KafkaError(KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, "not authorized", fatal=True)
    )
    with pytest.raises(PublishError) as caught:
        raise_for(refused, "init_transactions failed")
    assert not isinstance(caught.value, ProducerFencedError)
    assert TRANSACTIONAL_ID_ACL_HINT in str(caught.value)
    # aiokafka's wording is hinted where the worker logs it; a hint is never doubled.
    aiokafka = "init failed: TransactionalIdAuthorizationFailed: [Error 53]"
    assert with_acl_hint(aiokafka).endswith(f"({TRANSACTIONAL_ID_ACL_HINT})")
    assert with_acl_hint(with_acl_hint(aiokafka)) == with_acl_hint(aiokafka)
    assert with_acl_hint("init failed: _TRANSPORT") == "init failed: _TRANSPORT"


def test_fencing_stays_lease_lost() -> None:
    for name in ("_FENCED", "PRODUCER_FENCED", "ProducerFenced", "INVALID_PRODUCER_EPOCH"):
        assert classify(name) is ErrorKind.FENCED
