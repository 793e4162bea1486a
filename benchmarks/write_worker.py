"""One benchmark worker process for benchmarks/writes.py (not a module of outboxkit).

It imports outboxkit from whatever ``PYTHONPATH`` names, so the same loop can run against this
checkout and against an older one (``--old``) in one benchmark run. It uses only the writer's
public API (``Outbox``, ``OutboxConfig``, ``Message``), which both have.

Protocol, one JSON object per line: the parent sends a command, the worker warms up and answers
``{"ready": true}``, the parent sends ``go`` to every worker at once, the worker answers
``{"done": <transactions>}`` after ``seconds``.
"""

from __future__ import annotations

import json
import random
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

from outboxkit.events import Message
from outboxkit.outbox import Outbox, OutboxConfig

ACCOUNTS = 10_000
UPDATE = sa.text("UPDATE account SET balance = balance + 1 WHERE id = :id")
SELECT_1 = sa.text("SELECT 1")
PLAIN = sa.text(
    "INSERT INTO outboxkit.outbox_message (event_id, idempotency_key, content_digest, topic,"
    " message_key, payload, content_type, event_type)"
    " VALUES (:e, :k, '', 'account-events', :key, :p, 'application/json', 'balance.changed')"
)


def _message(account: int) -> Message:
    return Message(
        "account-events",
        {"account": account, "delta": 1, "note": "balance changed"},
        key=str(account),
        event_type="balance.changed",
    )


def transaction(engine: sa.Engine, variant: str) -> Callable[[int], None]:
    """The application transaction of one variant: update one business row, then maybe write."""
    quiet, loud = Outbox(OutboxConfig(notify=False)), Outbox(OutboxConfig(notify=True))
    pipelined = _pipelined() if variant == "pipelined" else None

    def one(account: int) -> None:
        with engine.begin() as conn:
            conn.execute(UPDATE, {"id": account})
            if variant == "select1":  # the floor: a statement that writes nothing
                conn.execute(SELECT_1).scalar_one()
            elif variant == "plain":
                event_id = uuid.uuid4()
                payload = json.dumps({"account": account, "delta": 1, "note": "balance changed"})
                conn.execute(
                    PLAIN,
                    {"e": event_id, "k": str(event_id), "key": str(account), "p": payload.encode()},
                )
            elif variant == "notify_off":
                quiet.add(conn, _message(account))
            elif variant == "notify_on":
                loud.add(conn, _message(account))
            elif variant == "pipelined" and pipelined is not None:
                pipelined(conn, account)
            elif variant != "base":
                raise ValueError(f"unknown variant {variant!r}")

    return one


def _pipelined() -> Callable[[Any, int], None]:
    """An experiment, not the writer: the same outbox row, its INSERT and the COMMIT sent
    together in psycopg's pipeline mode, so both cost one round trip (the business UPDATE
    before them another). psycopg's ``pipeline()`` block ends with one more Sync and its own
    round trip, so the pipeline is entered and left through psycopg internals here, leaving it
    only once the COMMIT's Sync has answered (nothing is pending then)."""
    import psycopg  # this checkout's experiment; the old workers never get here

    from outboxkit.db import query
    from outboxkit.outbox_plan import prepare

    config = OutboxConfig(notify=False)
    sql = query("outbox", "insert_one_silent", config.schema).psycopg_binary

    def write(conn: Any, account: int) -> None:
        driver = conn.connection.driver_connection
        params = prepare(_message(account), config)._asdict()
        pipeline = driver._pipeline = psycopg.Pipeline(driver)
        pipeline.__enter__()
        try:
            with driver.cursor() as cur:
                cur.execute(sql, params)  # sent, its reply not awaited
                driver.commit()  # COMMIT + Sync: one round trip for both
            if pipeline.result_queue or pipeline.command_queue:
                raise RuntimeError("pipeline not drained")
        finally:
            pipeline._exit(None)
            driver._pipeline = None

    return write


def _backend_cpu_ns(engine: sa.Engine) -> Callable[[], int]:
    """CPU time (ns) of the pool's one server process so far (the server runs on this machine).

    CPU time, unlike wall time, barely depends on how busy other programs keep the machine."""
    with engine.connect() as conn:
        pid = conn.execute(sa.text("SELECT pg_backend_pid()")).scalar_one()

    def used() -> int:
        with open(f"/proc/{pid}/schedstat") as f:
            return int(f.read().split()[0])

    return used


def _cpu(backend: Callable[[], int]) -> int:
    return time.process_time_ns() + backend()


def run_transactions(engine: sa.Engine, command: dict[str, Any]) -> None:
    one = transaction(engine, command["variant"])
    rng = random.Random(command["index"])
    own = [a for a in range(1, ACCOUNTS + 1) if a % command["workers"] == command["index"]]
    for _ in range(20):
        one(rng.choice(own))
    _reply({"ready": True})
    if sys.stdin.readline().strip() != "go":
        raise SystemExit("expected go")
    backend = _backend_cpu_ns(engine)
    cpu = _cpu(backend)
    done, end = 0, time.monotonic() + command["seconds"]
    while time.monotonic() < end:
        one(rng.choice(own))
        done += 1
    _reply({"done": [done, _cpu(backend) - cpu]})


def run_bulk(engine: sa.Engine, command: dict[str, Any]) -> None:
    """``add_many`` of ``rows`` messages in transactions of ``batch``; rows/s."""
    outbox = Outbox(OutboxConfig(notify=False, **command.get("config", {})))
    rows, batch = command["rows"], command["batch"]
    messages = [
        Message("account-events", {"account": i, "delta": 1, "note": "bulk"}, key=str(i % 997))
        for i in range(rows)
    ]
    _reply({"ready": True})
    if sys.stdin.readline().strip() != "go":
        raise SystemExit("expected go")
    backend = _backend_cpu_ns(engine)
    cpu, started = _cpu(backend), time.perf_counter()
    for i in range(0, rows, batch):
        with engine.begin() as conn:
            outbox.add_many(conn, messages[i : i + batch])
    elapsed = time.perf_counter() - started
    _reply({"done": [rows / elapsed, (_cpu(backend) - cpu) / rows]})


def _reply(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def main() -> None:
    engine = sa.create_engine(sys.argv[1], pool_size=1, max_overflow=0)
    _reply({"started": True})
    for line in sys.stdin:
        command = json.loads(line)
        if command["cmd"] == "tx":
            run_transactions(engine, command)
        elif command["cmd"] == "bulk":
            run_bulk(engine, command)
        elif command["cmd"] == "exit":
            break
    engine.dispose()


if __name__ == "__main__":
    main()
