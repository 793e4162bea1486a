"""The handlers the process-level consumer tests run (``outboxkit inbox run --registry ..``).

What it does depends on the order id's prefix, so one worker can mix behaviours:
``slow-`` sleeps ``APP_SLOW_SECONDS`` on the first attempt (checking its lease), ``fail-`` always
raises, ``held-`` waits until the file ``APP_RELEASE_FILE`` exists (checking its lease), then
raises, ``paused-`` does the same but returns (it creates ``APP_RELEASE_FILE`` + ``.waiting``
once its effect row is written and it waits, and ``.returned`` as it returns), ``wait-`` blocks
until its lease is lost (cancel), ``pay-`` charges the fake payment
server at ``APP_PAYMENT_URL`` with the idempotency key. Every handler writes one effect row.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import urllib.request
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from outboxkit.inbox import EventRegistry, HandlerContext
from tests.integration.inbox_support import INSERT_EFFECT, PaymentRequested

__all__ = ["ASYNC", "SYNC", "handle", "handle_async"]

SYNC = EventRegistry()  # for the sync driver (confluent-kafka)
ASYNC = EventRegistry()  # for the async driver (aiokafka)


def _charge(ctx: HandlerContext, order_id: str, amount: int) -> str:
    request = urllib.request.Request(
        os.environ["APP_PAYMENT_URL"] + "/charges",
        data=json.dumps({"order_id": order_id, "amount": amount}).encode(),
        headers={"Idempotency-Key": ctx.idempotency_key, "Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return str(json.loads(response.read())["charge_id"])


def _params(event: Any, ctx: HandlerContext) -> dict[str, Any]:
    return {
        "event_id": ctx.event_id,
        "order_id": event.order_id,
        "amount": event.amount,
        "attempt": ctx.attempt,
    }


def _held(event: Any, ctx: HandlerContext) -> bool:
    """Whether a ``held-`` or ``paused-`` event's handler still waits for the test to release
    it; a released ``paused-`` one says it is returning."""
    if not event.order_id.startswith(("held-", "paused-")):
        return False
    ctx.check()
    release = os.environ["APP_RELEASE_FILE"]
    if not os.path.exists(release):
        if event.order_id.startswith("paused-") and not os.path.exists(release + ".waiting"):
            with open(release + ".waiting", "w"):  # its effect row's statement has answered
                pass
        return True
    if event.order_id.startswith("paused-"):
        with open(release + ".returned", "w"):
            pass
    return False


def _slow_seconds(event: Any, ctx: HandlerContext) -> float:
    if event.order_id.startswith("slow-") and ctx.attempt == 1:
        return float(os.environ.get("APP_SLOW_SECONDS", "20"))
    if event.order_id.startswith("wait-"):
        return 60.0
    return 0.0


@SYNC.handler(PaymentRequested)
def handle(event: Any, ctx: HandlerContext, session: Session) -> None:
    if event.order_id.startswith("fail-"):
        raise RuntimeError(f"payment provider said no (attempt {ctx.attempt})")
    if event.order_id.startswith("pay-"):
        _charge(ctx, event.order_id, event.amount)
    session.execute(INSERT_EFFECT, _params(event, ctx))
    deadline = time.monotonic() + _slow_seconds(event, ctx)
    while time.monotonic() < deadline:
        ctx.check()  # raises LeaseLostError once the lease is gone
        time.sleep(0.1)
    while _held(event, ctx):
        time.sleep(0.05)
    if event.order_id.startswith("held-"):
        raise RuntimeError("payment provider gave up")


@ASYNC.handler(PaymentRequested)
async def handle_async(event: Any, ctx: HandlerContext, session: AsyncSession) -> None:
    if event.order_id.startswith("fail-"):
        raise RuntimeError(f"payment provider said no (attempt {ctx.attempt})")
    if event.order_id.startswith("pay-"):
        await asyncio.to_thread(_charge, ctx, event.order_id, event.amount)
    await session.execute(INSERT_EFFECT, _params(event, ctx))
    deadline = time.monotonic() + _slow_seconds(event, ctx)
    while time.monotonic() < deadline:
        ctx.check()
        await asyncio.sleep(0.1)
    while _held(event, ctx):  # noqa: ASYNC110 (the test's signal is a file)
        await asyncio.sleep(0.05)
    if event.order_id.startswith("held-"):
        raise RuntimeError("payment provider gave up")
