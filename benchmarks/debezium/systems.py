"""The two systems under test behind one small interface: prepare a database, start, stop.

- outboxkit: ``python -m outboxkit.relay run`` as its own process (the same as
  ``outboxkit relay run``), configured only by ``OUTBOXKIT_*`` variables, default settings.
- Debezium: a connector on a running Kafka Connect worker, reading the database's WAL through a
  publication and slot created before the rows are written.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Protocol

from benchmarks.debezium.config import (
    DEFAULT_POLL_INTERVAL_MS,
    EXACTLY_ONCE_SETTINGS,
    connector_config,
)
from benchmarks.debezium.connect import ConnectWorker
from benchmarks.debezium.workload import prepare_logical_decoding, wait_slot_released
from outboxkit.devstack import PostgresServer
from outboxkit.devstack.process import ServiceProcess

ROOT = Path(__file__).resolve().parents[2]


class System(Protocol):
    name: str
    mode: str
    id_header: str  # the Kafka header carrying the event id
    settings: dict[str, str]  # what differs from the system's defaults

    def prepare(self, url: str) -> None: ...
    def start(self, url: str, bootstrap: str) -> None: ...
    def stop(self) -> None: ...
    @property
    def pid(self) -> int | None: ...


class OutboxkitRelay:
    """One relay process, one shard, everything else at its defaults but the mode."""

    name = "outboxkit relay"
    id_header = "event-id"

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.settings = {"mode": mode}
        self._service: ServiceProcess | None = None
        self._dir: Path | None = None

    def prepare(self, url: str) -> None:
        """Nothing: the relay reads pending rows by state."""

    def start(self, url: str, bootstrap: str) -> None:
        run = uuid.uuid4().hex[:8]
        self._dir = Path(tempfile.mkdtemp(prefix="outboxkit-dbz-relay-"))
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
            "OUTBOXKIT_DATABASE_URL": url,
            "OUTBOXKIT_KAFKA_BOOTSTRAP": bootstrap,
            "OUTBOXKIT_RELAY_MODE": self.mode,
            "OUTBOXKIT_RELAY_GROUP": f"bench-{run}",
            "OUTBOXKIT_RELAY_CHECKPOINT_TOPIC": f"bench.checkpoint.{run}",
        }
        self._service = ServiceProcess(
            f"outboxkit-relay-{self.mode}",
            [sys.executable, "-m", "outboxkit.relay", "run"],
            self._dir / "relay.log",
            lambda: True,
            env=env,
            owned_dir=self._dir,
        )
        self._service.start()

    def stop(self) -> None:
        if self._service is not None:
            if not self._service.is_running():
                raise RuntimeError(f"relay exited early; log:\n{self.log_tail()}")
            self._service.stop(timeout=30)
            self._service = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def log_tail(self) -> str:
        if self._dir is None:
            return ""
        text = (self._dir / "relay.log").read_text(errors="replace")
        return "\n".join(text.splitlines()[-30:])

    @property
    def pid(self) -> int | None:
        return self._service.pid if self._service else None


class DebeziumOutbox:
    """Debezium's PostgreSQL connector + EventRouter on the given worker.

    On a standalone worker it is at-least-once; on a distributed worker with exactly-once source
    support, records and source offsets commit in one Kafka transaction per poll batch.
    """

    name = "Debezium"
    id_header = "id"  # the EventRouter puts the event id column into header "id"

    def __init__(
        self,
        worker: ConnectWorker,
        postgres: PostgresServer,
        poll_interval_ms: int = DEFAULT_POLL_INTERVAL_MS,
    ) -> None:
        self.worker = worker
        self.postgres = postgres
        self.poll_interval_ms = poll_interval_ms
        self.exactly_once = worker.distributed
        default = " (default)" if poll_interval_ms == DEFAULT_POLL_INTERVAL_MS else ""
        if self.exactly_once:
            self.mode = f"exactly_once (distributed), poll.interval.ms={poll_interval_ms}{default}"
        else:
            self.mode = f"at_least_once (standalone), poll.interval.ms={poll_interval_ms}{default}"
        self.settings = {"poll.interval.ms": str(poll_interval_ms)}
        if self.exactly_once:
            self.settings |= EXACTLY_ONCE_SETTINGS
        self._connector: str | None = None
        self._slot = self._publication = self._url = ""

    def prepare(self, url: str) -> None:
        run = uuid.uuid4().hex[:8]
        self._slot, self._publication = f"dbz_bench_{run}", f"dbz_bench_{run}"
        prepare_logical_decoding(url, self._publication, self._slot)

    def start(self, url: str, bootstrap: str) -> None:
        name = f"outbox-{self._slot.removeprefix('dbz_bench_')}"
        config = connector_config(
            name=name,
            db_port=self.postgres.port,
            db_user=self.postgres.user,
            db_password=self.postgres.password,
            db_name=url.rsplit("/", 1)[1].split("?")[0],
            slot=self._slot,
            publication=self._publication,
            poll_interval_ms=self.poll_interval_ms,
            exactly_once=self.exactly_once,
        )
        self._url = url
        self.worker.create(config)
        self._connector = name

    def stop(self) -> None:
        if self._connector is not None:
            self.worker.delete(self._connector)
            self._connector = None
            # The task stops after the connector is gone from the list; the next run starts
            # only when it has let go of its slot.
            if not wait_slot_released(self._url, self._slot, timeout=60):
                raise RuntimeError(f"slot {self._slot} still in use 60 s after the connector")

    @property
    def pid(self) -> int | None:
        return self.worker.pid
