"""The rows both systems read, the topics they write, and the read_committed reader that times them.

Each measured run gets its own migrated database (same server), so outboxkit's relay and
Debezium never read each other's rows, and its own target topic, created with
``message.timestamp.type=LogAppendTime`` so the broker stamps when each record was appended.
"""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass, field

import psycopg
import sqlalchemy as sa
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]
from psycopg import sql

from outboxkit import Message, Outbox
from outboxkit.db.migrator import upgrade
from outboxkit.devstack.postgres import database_url_with, sqlalchemy_url

KEYS = 1000
PAYLOAD_BYTES = 500
PARTITIONS = 4
EVENT_TYPE = "bench.event"
FILL_TRANSACTION_ROWS = 500
# A 500-byte JSON document: {"n": <row>, "pad": "xxx..."} padded to exactly PAYLOAD_BYTES.
_PAYLOAD_SQL = (
    "convert_to(json_build_object('n', g, 'pad', repeat('x', {pad} - length(g::text)))::text,"
    " 'UTF8')"
)


def payload(n: int) -> bytes:
    """The same document the SQL fill builds, for the writer of the latency runs."""
    head = f'{{"n" : {n}, "pad" : "'
    return (head + "x" * (PAYLOAD_BYTES - len(head) - 2) + '"}').encode()


def _pad_for_sql() -> int:
    # json_build_object renders {"n" : 1, "pad" : "..."}; the fixed part without n's digits:
    fixed = len('{"n" : , "pad" : ""}')
    return PAYLOAD_BYTES - fixed


def create_database(server_url: str, label: str) -> str:
    name = f"dbz_bench_{label}_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = database_url_with(server_url, name)
    upgrade(url)
    return url


def drop_database(server_url: str, url: str) -> None:
    name = url.rsplit("/", 1)[1].split("?")[0]
    with psycopg.connect(server_url, autocommit=True) as conn:
        for (slot,) in conn.execute(
            "SELECT slot_name FROM pg_replication_slots WHERE database = %s", (name,)
        ).fetchall():
            conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


def prepare_logical_decoding(url: str, publication: str, slot: str) -> None:
    """Publication, then slot, before any row is written: the whole backlog is in the slot."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE PUBLICATION {} FOR TABLE outboxkit.outbox_message").format(
                sql.Identifier(publication)
            )
        )
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))


def wait_slot_released(url: str, slot: str, timeout: float) -> bool:
    """True once no walsender holds ``slot``."""
    deadline = time.monotonic() + timeout
    with psycopg.connect(url, autocommit=True) as conn:
        while True:
            row = conn.execute(
                "SELECT active FROM pg_replication_slots WHERE slot_name = %s", (slot,)
            ).fetchone()
            if not (row and row[0]):
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.1)


def fill(url: str, topic: str, rows: int) -> float:
    """``rows`` pending rows in transactions of 500; returns the seconds it took."""
    started = time.monotonic()
    statement = f"""
        INSERT INTO outboxkit.outbox_message
            (event_id, idempotency_key, content_digest, topic, message_key, payload, event_type)
        SELECT e, 'bench-' || e, sha256(p), %(topic)s, k, p, %(type)s
        FROM (SELECT gen_random_uuid() AS e, 'key-' || (g %% {KEYS}) AS k,
                     {_PAYLOAD_SQL.format(pad=_pad_for_sql())} AS p
              FROM generate_series(%(first)s::int, %(last)s::int) AS g) s
    """
    with psycopg.connect(url, autocommit=False) as conn:
        for first in range(1, rows + 1, FILL_TRANSACTION_ROWS):
            last = min(rows, first + FILL_TRANSACTION_ROWS - 1)
            conn.execute(
                statement, {"topic": topic, "type": EVENT_TYPE, "first": first, "last": last}
            )
            conn.commit()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE outboxkit.outbox_message")
        size = conn.execute(
            "SELECT min(length(payload)), max(length(payload)) FROM outboxkit.outbox_message"
        ).fetchone()
    assert size == (PAYLOAD_BYTES, PAYLOAD_BYTES), f"payload sizes {size}"
    return time.monotonic() - started


def create_topic(bootstrap: str, name: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 3})
    topic = NewTopic(name, PARTITIONS, 1, config={"message.timestamp.type": "LogAppendTime"})
    for future in admin.create_topics([topic]).values():
        future.result(timeout=60)


@dataclass
class Reader:
    """A read_committed consumer on one topic that notes when each event id became visible.

    Partitions are assigned directly (no group rebalance to wait for), from the beginning.
    """

    bootstrap: str
    topic: str
    id_header: str  # "event-id" for outboxkit's relay, "id" for Debezium's EventRouter
    seen: dict[str, float] = field(default_factory=dict)  # event id -> monotonic arrival
    records: int = 0
    first_append_ms: int | None = None  # the broker's LogAppendTime of the earliest record
    last_new_wall: float = 0.0  # time.time() when the latest new event id arrived
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _assigned: threading.Event = field(default_factory=threading.Event)

    def start(self) -> Reader:
        self._thread = threading.Thread(target=self._run, daemon=True, name="reader")
        self._thread.start()
        if not self._assigned.wait(30):
            raise RuntimeError("reader did not start")
        return self

    def _run(self) -> None:
        consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": f"dbz-bench-{uuid.uuid4().hex}",
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                "fetch.wait.max.ms": 5,
            }
        )
        consumer.assign(
            [TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)]
        )
        self._assigned.set()
        try:
            while not self._stop.is_set():
                # poll, not consume(n, timeout): consume waits for n records or the timeout,
                # which would add up to the timeout to every measured latency.
                msg = consumer.poll(0.05)
                arrived, arrived_wall = time.monotonic(), time.time()
                if msg is not None and msg.error() is None:
                    self.records += 1
                    stamp = msg.timestamp()[1]
                    if self.first_append_ms is None or stamp < self.first_append_ms:
                        self.first_append_ms = stamp
                    headers = msg.headers()  # a received message's: a list of pairs
                    for name, value in headers if isinstance(headers, list) else []:
                        if name == self.id_header and isinstance(value, bytes):
                            event_id = value.decode()
                            if event_id not in self.seen:
                                self.seen[event_id] = arrived
                                self.last_new_wall = arrived_wall
        finally:
            consumer.close()

    def wait_for(self, count: int, timeout: float) -> float | None:
        """Wall-clock time (``time.time()``) when ``count`` distinct events were visible."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if len(self.seen) >= count:
                return self.last_new_wall
            time.sleep(0.01)
        return None

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(15)


def steady_writer(
    url: str, topic: str, rate: int, seconds: float, committed: dict[str, float]
) -> None:
    """outboxkit's own writer at ``rate`` events/s: 10 events per transaction every 10 ms.

    Records each event's commit time (monotonic, after COMMIT returned) by event id.
    """
    per_txn = max(1, rate // 100)
    engine = sa.create_engine(sqlalchemy_url(url), pool_size=1)
    outbox = Outbox()
    n = 0
    try:
        tick = time.monotonic()
        end = tick + seconds
        while tick < end:
            messages = []
            for _ in range(per_txn):
                n += 1
                messages.append(
                    Message(
                        topic=topic,
                        payload=payload(n),
                        key=f"key-{n % KEYS}",
                        event_type=EVENT_TYPE,
                        content_type="application/json",
                    )
                )
            with engine.begin() as conn:
                results = outbox.add_many(conn, messages)
            done = time.monotonic()
            for result in results:
                committed[str(result.event_id)] = done
            tick += 0.01
            pause = tick - time.monotonic()
            if pause > 0:
                time.sleep(pause)
    finally:
        engine.dispose()
