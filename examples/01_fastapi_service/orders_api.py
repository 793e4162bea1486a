"""Example 01: a FastAPI service writing events in the same transaction as its state change.

``POST /orders`` inserts an order and its ``order.placed`` event in ONE database transaction
(async SQLAlchemy), and answers only after the commit: the event exists iff the order does.
The ``Idempotency-Key`` header makes a retried request safe: the event is written first, and a
key already written with the same content is a duplicate (the existing order is returned, nothing
is written); the same key with other content is refused (409). ``POST /orders/{id}/cancel``
updates the order and writes ``order.cancelled``; both events carry the order id as their Kafka
key, so consumers see them in order.

    eval $(outboxkit dev env) && outboxkit migrate up
    uvicorn --app-dir examples/01_fastapi_service orders_api:app    # or python .../orders_api.py
    curl -X POST localhost:8000/orders -H 'Idempotency-Key: k1' \
         -H 'Content-Type: application/json' -d '{"customer": "ada", "total_cents": 1250}'
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated

from fastapi import FastAPI, Header, HTTPException, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from sqlalchemy import make_url
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from outboxkit import Event, IdempotencyKeyConflictError, Outbox

TOPIC = os.environ.get("EXAMPLE_TOPIC", "example.orders")
ORDER_IDS = uuid.UUID("1b7c0f55-4c8a-4d2e-9a51-0e6f3f9b2a10")  # namespace: key -> order id
CREDIT_LIMIT_CENTS = 100_000


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "example_api_order"
    id: Mapped[str] = mapped_column(primary_key=True)
    customer: Mapped[str]
    total_cents: Mapped[int]
    status: Mapped[str] = mapped_column(default="placed")


class OrderPlaced(Event, topic=TOPIC, key="order_id", event_type="order.placed"):
    order_id: str
    customer: str
    total_cents: int


class OrderCancelled(Event, topic=TOPIC, key="order_id", event_type="order.cancelled"):
    order_id: str
    reason: str


class PlaceOrder(BaseModel):
    customer: str = Field(min_length=1)
    total_cents: int = Field(gt=0)


class CancelOrder(BaseModel):
    reason: str


class OrderOut(BaseModel):
    id: str
    customer: str
    total_cents: int
    status: str


outbox = Outbox()


def _out(order: Order) -> OrderOut:
    return OrderOut(
        id=order.id, customer=order.customer, total_cents=order.total_cents, status=order.status
    )


def create_app(database_url: str | None = None) -> FastAPI:
    """The app; the database URL defaults to ``OUTBOXKIT_DATABASE_URL`` (read at start-up)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        url = make_url(database_url or os.environ["OUTBOXKIT_DATABASE_URL"])
        engine = create_async_engine(url.set(drivername="postgresql+psycopg"))
        async with engine.begin() as conn:  # a real service runs its migrations instead
            await conn.run_sync(Base.metadata.create_all)
        app.state.sessions = async_sessionmaker(engine, expire_on_commit=False)
        yield
        await engine.dispose()

    app = FastAPI(title="orders (outboxkit example)", lifespan=lifespan)

    def sessions(request: Request) -> async_sessionmaker[AsyncSession]:
        maker: async_sessionmaker[AsyncSession] = request.app.state.sessions
        return maker

    @app.exception_handler(IdempotencyKeyConflictError)
    async def key_conflict(request: Request, exc: IdempotencyKeyConflictError) -> JSONResponse:
        detail = "this Idempotency-Key was used for another request"
        return JSONResponse({"detail": detail}, status_code=409)

    @app.post("/orders", status_code=201)
    async def place_order(
        body: PlaceOrder,
        idempotency_key: Annotated[str, Header(min_length=1)],
        request: Request,
        response: Response,
    ) -> OrderOut:
        # The same key gives the same order id, so a retry carries the same event content.
        order_id = str(uuid.uuid5(ORDER_IDS, idempotency_key))
        event = OrderPlaced(order_id=order_id, customer=body.customer, total_cents=body.total_cents)
        async with sessions(request)() as session, session.begin():
            result = await outbox.add_async(
                session, event, idempotency_key=f"place-order:{idempotency_key}"
            )
            if result.duplicate:  # a retry: the first request already placed it
                existing = await session.get(Order, order_id)
                assert existing is not None  # it committed together with its event
                response.status_code = 200
                return _out(existing)
            order = Order(id=order_id, customer=body.customer, total_cents=body.total_cents)
            session.add(order)
            if body.total_cents > CREDIT_LIMIT_CENTS:
                # Failing after the writes: the rollback takes the order AND its event.
                raise HTTPException(422, "over the credit limit")
        return _out(order)  # answered after the commit

    @app.post("/orders/{order_id}/cancel")
    async def cancel_order(order_id: str, body: CancelOrder, request: Request) -> OrderOut:
        async with sessions(request)() as session, session.begin():
            order = await session.get(Order, order_id, with_for_update=True)
            if order is None:
                raise HTTPException(404, "no such order")
            if order.status == "cancelled":
                raise HTTPException(409, "already cancelled")
            order.status = "cancelled"
            await outbox.add_async(session, OrderCancelled(order_id=order_id, reason=body.reason))
        return _out(order)

    @app.get("/orders/{order_id}")
    async def get_order(order_id: str, request: Request) -> OrderOut:
        async with sessions(request)() as session:
            order = await session.get(Order, order_id)
        if order is None:
            raise HTTPException(404, "no such order")
        return _out(order)

    return app


app = create_app()

if __name__ == "__main__":
    import uvicorn

    uvicorn.run(app, host="127.0.0.1", port=8000)
