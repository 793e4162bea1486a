"""What a batch handler gains over per-event handlers in a batch: events/s, both clients.

Run: ``python benchmarks/batch_handler.py`` (its own durable PostgreSQL + Kafka unless
``OUTBOXKIT_DATABASE_URL`` and ``OUTBOXKIT_KAFKA_BOOTSTRAP`` name running ones; a scratch
database is created and dropped either way). The consumers are those of
``benchmarks/consumer.py`` (batches of 50, offsets every second, one effect row per event):

* ``mw/batch``: the middleware batched, a per-event handler (one ``INSERT`` per event);
* ``mw/bulk``: the same with a batch handler writing the batch's rows in one ``executemany``;
* ``bare/batch``, ``bare/bulk``: a bare consumer (``benchmarks/consumer.py``) committing each
  fetched batch's effect rows in one transaction, one ``INSERT`` per event or the batch's rows in
  one ``executemany``: ``mw/batch : bare/batch`` and ``mw/bulk : bare/bulk`` compare the same
  writes with and without the middleware (printed round by round when both ran).

``--variants mw/batch`` runs only that one (it also runs on code without batch handlers, to
compare before and after a change). Variants alternate between rounds; medians are printed.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/ is not a package
import consumer as base

from outboxkit.db import migrator, sqlalchemy_url
from outboxkit.devstack import DevStack
from outboxkit.inbox import EventRegistry

Runner = Callable[[str, str, str, int, float], float]


def bulk_registry(coroutines: bool) -> EventRegistry:
    """``charged`` with a batch handler: one executemany per call."""
    from outboxkit.inbox import BatchContext

    registry = EventRegistry()

    def rows(events: Sequence[Any], ctx: BatchContext) -> list[dict[str, Any]]:
        pairs = zip(events, ctx, strict=True)
        return [{"event_id": c.event_id, "amount": e.amount} for e, c in pairs]

    if coroutines:

        @registry.batch_handler(base.Charged, event_type="charged")
        async def bulk_async(events: Sequence[Any], ctx: BatchContext, session: Any) -> None:
            await session.execute(base.INSERT, rows(events, ctx))

    else:

        @registry.batch_handler(base.Charged, event_type="charged")
        def bulk(events: Sequence[Any], ctx: BatchContext, session: Any) -> None:
            session.execute(base.INSERT, rows(events, ctx))

    return registry


@contextmanager
def registry_of(registry: EventRegistry) -> Iterator[None]:
    """The consumers of ``benchmarks/consumer.py`` read its module-level registry when they
    start: swapped for the run, so both variants share every other line."""
    saved, base.REGISTRY = base.REGISTRY, registry
    try:
        yield
    finally:
        base.REGISTRY = saved


def bulk_confluent(url: str, bootstrap: str, topic: str, events: int, interval: float) -> float:
    with registry_of(bulk_registry(coroutines=False)):
        return base.middleware_confluent_batch(url, bootstrap, topic, events, interval)


def bulk_aiokafka(url: str, bootstrap: str, topic: str, events: int, interval: float) -> float:
    with registry_of(bulk_registry(coroutines=True)):
        return base.middleware_aiokafka_batch(url, bootstrap, topic, events, interval)


VARIANTS: list[tuple[str, str, Runner]] = [
    ("confluent", "bare/batch", base.bare_confluent_batch),
    ("confluent", "bare/bulk", functools.partial(base.bare_confluent_batch, bulk=True)),
    ("confluent", "mw/batch", base.middleware_confluent_batch),
    ("confluent", "mw/bulk", bulk_confluent),
    ("aiokafka", "bare/batch", base.bare_aiokafka_batch),
    ("aiokafka", "bare/bulk", functools.partial(base.bare_aiokafka_batch, bulk=True)),
    ("aiokafka", "mw/batch", base.middleware_aiokafka_batch),
    ("aiokafka", "mw/bulk", bulk_aiokafka),
]
RATIOS = [("mw/batch", "bare/batch"), ("mw/bulk", "bare/bulk"), ("mw/bulk", "mw/batch")]


def run(server_url: str, bootstrap: str, events: int, rounds: int, names: set[str]) -> None:
    variants = [v for v in VARIANTS if v[1] in names]
    with base.scratch_database(server_url) as db_url:
        migrator.upgrade(db_url)
        with psycopg.connect(db_url) as conn:
            conn.execute(base.EFFECT_DDL)
        topic = base._produce(bootstrap, events)
        rates: dict[tuple[str, str], list[float]] = {}
        for round_no in range(1, rounds + 1):
            order = variants if round_no % 2 else list(reversed(variants))  # alternate
            for client, variant, runner in order:
                rate = runner(sqlalchemy_url(db_url), bootstrap, topic, events, base.INTERVAL)
                rates.setdefault((client, variant), []).append(rate)
                print(f"round {round_no}  {client:9} {variant:10} {rate:8.0f} events/s", flush=True)
    print(f"\n{events} events, one effect row each; median of {rounds} rounds (events/s)")
    for (client, variant), values in rates.items():
        print(f"{client:10}{variant:11}{statistics.median(values):8.0f}")
    for a, b in RATIOS:
        for client in ("confluent", "aiokafka"):
            if (client, a) in rates and (client, b) in rates:
                pairs = zip(rates[(client, a)], rates[(client, b)], strict=True)
                paired = [x / y for x, y in pairs]
                print(
                    f"  {client:9} {a} : {b} round by round: "
                    + ", ".join(f"{r:.2f}" for r in paired)
                    + f" (median {statistics.median(paired):.2f})"
                )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=800)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--variants", default="bare/batch,bare/bulk,mw/batch,mw/bulk")
    args = parser.parse_args()
    names = set(args.variants.split(","))
    url = os.environ.get("OUTBOXKIT_DATABASE_URL")
    bootstrap = os.environ.get("OUTBOXKIT_KAFKA_BOOTSTRAP")
    if url and bootstrap:
        run(url, bootstrap, args.events, args.rounds, names)
        return
    with DevStack(durable=True) as stack:
        run(stack.database_url, stack.kafka_bootstrap, args.events, args.rounds, names)


if __name__ == "__main__":
    main()
