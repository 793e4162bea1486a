"""Example 02: a plain (sync) SQLAlchemy script writing orders and their events together.

Each order row and its ``order.placed`` event commit in ONE transaction: either both exist or
neither. The script also shows what the outbox does with a retried request (same idempotency
key, same content: a duplicate, nothing written), a reused key with other content (refused), a
rolled-back transaction (no event) and a batch written with ``add_many``.

    eval $(outboxkit dev env) && outboxkit migrate up
    python examples/02_sync_script/place_orders.py
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass

from sqlalchemy import Engine, create_engine, make_url, select
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from outboxkit import Event, IdempotencyKeyConflictError, Outbox, WriteResult
from outboxkit.testing import outboxed

TOPIC = os.environ.get("EXAMPLE_TOPIC", "example.orders")


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "example_order"
    id: Mapped[str] = mapped_column(primary_key=True)
    customer: Mapped[str]
    total_cents: Mapped[int]


class OrderPlaced(Event, topic=TOPIC, key="order_id", event_type="order.placed"):
    order_id: str
    customer: str
    total_cents: int


outbox = Outbox()  # schema "outboxkit"; one instance is enough for the whole application


def place_order(session: Session, request_id: str, order: Order) -> WriteResult:
    """The state change and its event on the caller's transaction (outboxkit never commits).

    The event goes first: a retried request finds its key taken and changes nothing.
    """
    event = OrderPlaced(order_id=order.id, customer=order.customer, total_cents=order.total_cents)
    result = outbox.add(session, event, idempotency_key=f"place-order:{request_id}")
    if not result.duplicate:
        session.add(order)
    return result


@dataclass
class Summary:
    order_ids: list[str]  # the orders this run placed (each has exactly one event)
    events: int
    retry_was_duplicate: bool
    conflict_refused: bool


def run(engine: Engine, count: int) -> Summary:
    Base.metadata.create_all(engine)
    run_id = uuid.uuid4().hex[:6]  # so the script can run again on the same database

    def order(n: object, customer: str = "ada", total_cents: int = 500) -> Order:
        return Order(id=f"{run_id}-{n}", customer=customer, total_cents=total_cents)

    for n in range(count):
        with Session(engine) as session, session.begin():
            place_order(session, f"{run_id}-req-{n}", order(n))

    # The client timed out and sent request 0 again: same key, same content.
    with Session(engine) as session, session.begin():
        retry = place_order(session, f"{run_id}-req-0", order(0))

    # A client bug reuses a key for another order: refused, and this transaction rolls back.
    try:
        with Session(engine) as session, session.begin():
            place_order(session, f"{run_id}-req-1", order("x", "bob", 999))
        conflict_refused = False
    except IdempotencyKeyConflictError:
        conflict_refused = True

    # Something fails after the write: the rollback takes the order AND its event with it.
    try:
        with Session(engine) as session, session.begin():
            place_order(session, f"{run_id}-req-lost", order("lost"))
            raise RuntimeError("payment declined")
    except RuntimeError:
        pass

    # A bulk import: many events in one statement (a streamed COPY from 100 rows).
    imported = [
        OrderPlaced(order_id=f"{run_id}-import-{n}", customer="import", total_cents=n)
        for n in range(3)
    ]
    with Session(engine) as session, session.begin():
        session.add_all(
            Order(id=e.order_id, customer=e.customer, total_cents=e.total_cents) for e in imported
        )
        outbox.add_many(session, imported)

    with Session(engine) as session:
        order_ids = session.scalars(select(Order.id).where(Order.id.startswith(run_id))).all()
        events = [m for m in outboxed(session, topic=TOPIC) if m.key and m.key.startswith(run_id)]
    return Summary(sorted(order_ids), len(events), retry.duplicate, conflict_refused)


def main(database_url: str, count: int = 5) -> Summary:
    # OUTBOXKIT_DATABASE_URL is a libpq URL; SQLAlchemy wants its driver named.
    engine = create_engine(make_url(database_url).set(drivername="postgresql+psycopg"))
    try:
        return run(engine, count)
    finally:
        engine.dispose()


if __name__ == "__main__":
    print(main(os.environ["OUTBOXKIT_DATABASE_URL"]))
