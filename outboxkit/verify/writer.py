"""One writer process of ``outboxkit verify``: random outbox writes, each outcome recorded.

Run as ``python -m outboxkit.verify.writer``. Every write's outcome is appended to a JSON-lines
file as soon as the writer knows it, so a writer the run stops keeps what it learned. The mix:
commits, rollbacks, transactions held open (so a lower id commits after higher ones), and
repeats of an earlier idempotency key with the same content (must be a duplicate) and with
other content (must be refused). A lost connection before COMMIT is a rollback; during COMMIT
the outcome is unknown, and is recorded so.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import time
import uuid
from dataclasses import asdict, dataclass
from typing import IO, Any

import sqlalchemy as sa

from outboxkit.db.engines import sync_engine
from outboxkit.errors import IdempotencyKeyConflictError, OutboxkitError
from outboxkit.events import Message
from outboxkit.outbox import Outbox
from outboxkit.settings import load_database_settings
from outboxkit.verify.history import WriteOp, WriteOutcome
from outboxkit.verify.target import DATABASE_ENV
from outboxkit.verify.workload import EVENT_TYPE, NEXT_SEQ, SCHEMA, VerifyEvent, payload_bytes
from outboxkit.wire import JSON_CONTENT_TYPE, content_digest

# Action weights: the share of each kind of write attempt.
ACTIONS = ("commit", "rollback", "hold", "same", "other")
WEIGHTS = (70, 10, 10, 5, 5)
_DB_ERRORS = (sa.exc.DBAPIError, sa.exc.StatementError, OSError)


@dataclass(frozen=True)
class _Stored:
    """A committed write a later attempt may repeat."""

    event_id: str
    idempotency_key: str
    topic: str
    key: str
    event: VerifyEvent


class Writer:
    def __init__(self, args: argparse.Namespace, out: IO[str]) -> None:
        self.index: int = args.index
        self.name = f"writer-{args.index}"
        self.key_prefix: str = args.run_id  # keys of one run are shared by its writers only
        self.rng = random.Random(f"{args.seed}:writer:{args.index}")
        self.topics: list[str] = args.topic
        self.keys: int = args.keys
        self.interval = 1.0 / args.rate if args.rate > 0 else 0.0
        self.t0: float = args.t0
        self.out = out
        self.outbox = Outbox(schema=SCHEMA)
        self.engine = sync_engine(
            args.database_url,
            pool_size=1,
            max_overflow=0,
            pool_pre_ping=True,
            connect_args={
                "application_name": args.application_name,
                "connect_timeout": 5,
                # [database] prepared_statements, as the run's relays and consumers read it
                **load_database_settings().database.connect_options(),
            },
        )
        self.stored: list[_Stored] = []
        self.n = 0
        self.stopping = False

    def record(self, op: WriteOp) -> None:
        data = asdict(op)
        data["time"] = round(time.time() - self.t0, 3)
        self.out.write(json.dumps(data, default=str) + "\n")
        self.out.flush()

    def run(self) -> None:
        while not self.stopping:
            started = time.monotonic()
            action = self.rng.choices(ACTIONS, WEIGHTS)[0]
            if action in ("same", "other") and not self.stored:
                action = "commit"
            try:
                if action in ("same", "other"):
                    self.repeat(self.rng.choice(self.stored[-200:]), same=action == "same")
                else:
                    self.write(action)
            except _DB_ERRORS:
                time.sleep(0.2 + self.rng.random() * 0.3)  # the database is away: back off
            spare = self.interval - (time.monotonic() - started)
            if spare > 0:
                time.sleep(spare)
        self.engine.dispose()

    def _digest(self, topic: str, key: str, payload: bytes) -> str:
        return content_digest(
            topic=topic,
            key=key,
            event_type=EVENT_TYPE,
            content_type=JSON_CONTENT_TYPE,
            payload=payload,
        ).hex()

    def _message(self, topic: str, event: VerifyEvent, ikey: str, event_id: uuid.UUID) -> Message:
        return Message(
            topic=topic,
            payload=event,
            key=event.key,
            event_type=EVENT_TYPE,
            content_type=JSON_CONTENT_TYPE,
            idempotency_key=ikey,
            event_id=event_id,
        )

    def write(self, action: str) -> None:
        self.n += 1
        topic = self.rng.choice(self.topics)
        key = f"{self.key_prefix}-k{self.rng.randrange(self.keys)}"
        event_id = uuid.uuid4()
        ikey = f"{self.key_prefix}:{self.name}:{self.n}"
        hold = self.rng.uniform(0.2, 1.5) if action == "hold" else 0.0
        op: dict[str, Any] = {"writer": self.name, "event_id": str(event_id)}
        op |= {"idempotency_key": ikey, "topic": topic, "key": key}
        committing = False
        try:
            with self.engine.connect() as conn:
                trans = conn.begin()
                seq = int(conn.execute(NEXT_SEQ, {"topic": topic, "key": key}).scalar_one())
                event = VerifyEvent(writer=self.index, n=self.n, key=key, seq=seq)
                op |= {"seq": seq, "digest": self._digest(topic, key, payload_bytes(event))}
                try:
                    self.outbox.add(conn, self._message(topic, event, ikey, event_id))
                except IdempotencyKeyConflictError:  # a fresh key: the checker judges it
                    trans.rollback()
                    self.record(WriteOp(**op, outcome=WriteOutcome.REJECTED))
                    return
                if hold:
                    time.sleep(hold)
                if action == "rollback":
                    trans.rollback()
                    self.record(WriteOp(**op, outcome=WriteOutcome.ROLLED_BACK))
                    return
                committing = True
                trans.commit()
        except _DB_ERRORS:
            if "digest" in op:
                outcome = WriteOutcome.UNKNOWN if committing else WriteOutcome.ROLLED_BACK
                self.record(WriteOp(**op, outcome=outcome))
            raise
        self.record(WriteOp(**op, outcome=WriteOutcome.COMMITTED))
        self.stored.append(_Stored(str(event_id), ikey, topic, key, event))

    def repeat(self, ref: _Stored, *, same: bool) -> None:
        """The same idempotency key again: same content is a duplicate, other is refused."""
        event = ref.event if same else ref.event.model_copy(update={"variant": self.n + 1})
        event_id = uuid.uuid4()
        digest = self._digest(ref.topic, ref.key, payload_bytes(event))
        op: dict[str, Any] = {"writer": self.name, "event_id": str(event_id), "digest": digest}
        op |= {"idempotency_key": ref.idempotency_key, "topic": ref.topic, "key": ref.key}
        op["seq"] = event.seq
        committing = False
        try:
            with self.engine.connect() as conn:
                trans = conn.begin()
                try:
                    result = self.outbox.add(
                        conn, self._message(ref.topic, event, ref.idempotency_key, event_id)
                    )
                except IdempotencyKeyConflictError:
                    trans.rollback()
                    self.record(WriteOp(**op, outcome=WriteOutcome.REJECTED))
                    return
                committing = True
                trans.commit()
        except _DB_ERRORS:
            outcome = WriteOutcome.UNKNOWN if committing else WriteOutcome.ROLLED_BACK
            self.record(WriteOp(**op, outcome=outcome))
            raise
        if result.duplicate:
            existing = str(result.event_id)
            self.record(WriteOp(**op, outcome=WriteOutcome.DUPLICATE, existing_event_id=existing))
        else:  # a second row for the key: recorded as what it is, the checker flags it
            self.record(WriteOp(**op, outcome=WriteOutcome.COMMITTED))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m outboxkit.verify.writer")
    parser.add_argument(
        "--database-url",
        default=os.environ.get(DATABASE_ENV),
        help=f"default: {DATABASE_ENV} (a command line is readable by other local users)",
    )
    parser.add_argument("--index", type=int, required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--topic", action="append", required=True)
    parser.add_argument("--keys", type=int, default=16)
    parser.add_argument("--rate", type=float, default=10.0, help="write attempts per second")
    parser.add_argument("--t0", type=float, default=time.time())
    parser.add_argument("--application-name", default="outboxkit-verify-writer")
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    if not args.database_url:
        parser.error(f"--database-url or {DATABASE_ENV} is required")
    writer = Writer(args, sys.stdout)

    def stop(*_: Any) -> None:
        writer.stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    with open(args.out, "a") as out:  # exists once the writer is ready: the run waits for it
        writer.out = out
        try:
            writer.run()
        except OutboxkitError as exc:
            raise SystemExit(f"{writer.name}: {exc}") from exc


if __name__ == "__main__":
    main()
