"""Concurrent writers: orders and their events in the same transactions, some rolled back.

Each writer keeps a few orders in flight, so events of different orders (and writers) interleave
in the outbox, and every order's three events land in three separate transactions. A share of
the transactions is rolled back on purpose; their event ids are remembered, so the checks can
prove that none of them ever reached the consumer.
"""

from __future__ import annotations

import dataclasses
import random
import threading
import time
import uuid
from dataclasses import dataclass, field

import sqlalchemy as sa
from sqlalchemy.orm import Session

from outboxkit.demo.app import LIFECYCLE, OrderEvent, OrderPlaced, demo_order
from outboxkit.events import Message
from outboxkit.outbox import Outbox


@dataclass(frozen=True)
class WritePlan:
    writers: int = 4
    orders_per_writer: int = 20
    seconds: float = 10.0  # how long the writes are spread over
    rollback_share: float = 0.2
    seed: int = 7


@dataclass
class WriteLog:
    """What the writers did, shared by their threads (guarded by ``lock``)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    committed: dict[str, tuple[str, int]] = field(default_factory=dict)  # event id -> order, seq
    orders: dict[str, int] = field(default_factory=dict)  # committed order -> amount
    rolled_back: set[str] = field(default_factory=set)  # event ids of rolled-back transactions
    rolled_back_transactions: int = 0
    errors: list[str] = field(default_factory=list)

    @property
    def written(self) -> int:
        with self.lock:
            return len(self.committed)


class Writers:
    """``start()`` the writer threads; ``join()`` waits for them."""

    def __init__(self, engine: sa.Engine, topic: str, plan: WritePlan) -> None:
        self.engine = engine
        self.topic = topic
        self.plan = plan
        self.log = WriteLog()
        self.stop = threading.Event()
        self._outbox = Outbox()
        self._threads = [
            threading.Thread(target=self._guarded, args=(w,), name=f"demo-writer-{w}", daemon=True)
            for w in range(plan.writers)
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def join(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            if thread.ident is not None:  # not started: the demo failed before the writes
                thread.join(max(0.0, deadline - time.monotonic()))
        return not self.alive

    @property
    def alive(self) -> bool:
        return any(thread.is_alive() for thread in self._threads)

    def _guarded(self, writer: int) -> None:
        try:
            self._write(writer)
        except Exception as exc:  # reported by the checks, not a traceback on the screen
            with self.log.lock:
                self.log.errors.append(f"writer {writer}: {type(exc).__name__}: {exc}")

    def _write(self, writer: int) -> None:
        plan = self.plan
        rng = random.Random(plan.seed * 1000 + writer)
        pause = plan.seconds / (plan.orders_per_writer * len(LIFECYCLE))
        in_flight: list[tuple[str, int]] = []  # (order id, next step)
        placed = 0
        while (placed < plan.orders_per_writer or in_flight) and not self.stop.is_set():
            if placed < plan.orders_per_writer:
                placed += 1
                order_id = f"w{writer}-{placed:03d}"
                if self._transaction(order_id, 0, rng, amount=rng.randint(100, 9_999)):
                    in_flight.append((order_id, 1))
            if in_flight and (len(in_flight) >= 3 or placed >= plan.orders_per_writer):
                order_id, step = in_flight.pop(0)
                # A rolled-back status change is retried, as an application would.
                while not self._transaction(order_id, step, rng) and not self.stop.is_set():
                    pass
                if step + 1 < len(LIFECYCLE):
                    in_flight.append((order_id, step + 1))
            time.sleep(pause * rng.uniform(0.5, 1.5))

    def _transaction(self, order_id: str, step: int, rng: random.Random, amount: int = 0) -> bool:
        """One business transaction with its event; False if it was rolled back."""
        kind = LIFECYCLE[step]
        event: OrderEvent
        if kind is OrderPlaced:
            event = OrderPlaced(order_id=order_id, seq=1, amount_cents=amount)
        else:
            event = kind(order_id=order_id, seq=step + 1)
        event_id = uuid.uuid4()
        message = dataclasses.replace(
            Message.from_event(event, event_id=event_id), topic=self.topic
        )
        rollback = rng.random() < self.plan.rollback_share
        with Session(self.engine) as session:
            session.begin()
            if kind is OrderPlaced:
                session.execute(demo_order.insert().values(id=order_id, amount_cents=amount))
            self._outbox.add(session, message)
            if rollback:
                session.rollback()  # e.g. a payment check failed: no order, no event
            else:
                session.commit()
        with self.log.lock:
            if rollback:
                self.log.rolled_back.add(str(event_id))
                self.log.rolled_back_transactions += 1
            else:
                self.log.committed[str(event_id)] = (order_id, step + 1)
                if kind is OrderPlaced:
                    self.log.orders[order_id] = amount
        return not rollback
