"""The nemesis of a verify run: which fault next, on whom, and doing it.

Every choice comes from one seeded random generator, so a seed names a schedule. The first
round injects each available kind once (in a seeded order), so even a short run covers them all;
after that kinds are drawn by weight. Broker and PostgreSQL restarts, and terminating every
backend of the database, happen only on a self-started stack (``stack`` given): on someone's
own deployment the nemesis disturbs only the processes the run started (and their backends).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import psycopg

from outboxkit import db
from outboxkit.devstack import DevStack
from outboxkit.devstack.process import ManagedServer
from outboxkit.errors import OutboxkitError
from outboxkit.faults import POINTS
from outboxkit.verify.history import Fault
from outboxkit.verify.procs import Child, Fleet

SIGKILL = "sigkill"
SIGSTOP = "sigstop"
REBALANCE = "rebalance"
KILL_POINT = "kill_point"  # a process armed with OUTBOXKIT_FAULT killed itself at that point
TERMINATE_BACKENDS = "pg_terminate_backend"
BROKER_RESTART = "broker_restart"
PG_RESTART = "pg_restart"

WEIGHTS = {
    SIGKILL: 30,
    SIGSTOP: 25,
    REBALANCE: 15,
    KILL_POINT: 15,
    TERMINATE_BACKENDS: 10,
    BROKER_RESTART: 3,
    PG_RESTART: 3,
}
RELAY_POINTS = tuple(p for p in POINTS if p not in ("before_db_commit", "after_db_commit"))
CONSUMER_POINTS = ("before_db_commit", "after_db_commit")
_SERVER_THREAD = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nemesis")
RESTART_TIMEOUT = 300.0  # seconds a restarted server may take to be ready
MIN_GAP = {BROKER_RESTART: 120.0, PG_RESTART: 60.0}  # seconds between two restarts of a server
BLOCKING = (TERMINATE_BACKENDS, BROKER_RESTART, PG_RESTART)  # run in the server thread


@dataclass
class Nemesis:
    """Call :meth:`step` from the run's loop; it injects a fault when one is due."""

    seed: int
    fleet: Fleet
    database_url: str
    application_prefix: str  # backends of the run's own processes start with this
    start_extra_consumer: Callable[[str], Child]  # a temporary member of a consumer's group
    stack: DevStack | None = None
    mean_interval: float = 3.0
    t0: float = field(default_factory=time.monotonic)
    faults: list[Fault] = field(default_factory=list)
    _resume_at: list[tuple[float, Child]] = field(default_factory=list)
    _extras: list[tuple[float, Child]] = field(default_factory=list)
    _next_at: float = 0.0
    _last: dict[str, float] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)  # faults that broke the run itself
    notes: list[str] = field(default_factory=list)  # trouble the run recovered from
    _busy: Future[None] | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.rng = random.Random(f"{self.seed}:nemesis")
        self.kinds = [k for k in WEIGHTS if self._available(k)]
        self._first_round = [k for k in self.kinds if k != KILL_POINT]
        self.rng.shuffle(self._first_round)
        self._first_round.append(KILL_POINT)  # popped first: an armed point needs time to fire
        self._next_at = float("inf")  # nothing until begin()

    def _available(self, kind: str) -> bool:
        """Servers are restarted only when this run started them."""
        if kind == BROKER_RESTART:
            return self.stack is not None and self.stack.kafka is not None
        if kind == PG_RESTART:
            return self.stack is not None and self.stack.postgres is not None
        return True

    def begin(self, at: float) -> None:
        """The processes are up: the first fault comes a little after ``at``."""
        self._next_at = at + 2.0

    def now(self) -> float:
        return time.monotonic() - self.t0

    def record(self, kind: str, target: str, detail: str = "") -> None:
        with self._lock:
            at = round(self.now(), 3)
            self.faults.append(Fault(kind=kind, target=target, time=at, detail=detail))

    def kill_point_hit(self, child: Child, point: str) -> None:
        self.record(KILL_POINT, child.name, point)

    def step(self) -> None:
        clock = time.monotonic()
        for at, child in list(self._resume_at):
            if clock >= at:
                child.resume()
                self._resume_at.remove((at, child))
        for at, child in list(self._extras):
            if clock >= at:
                child.ask_to_stop()  # the run's final stop reaps it
                self._extras.remove((at, child))
        if clock < self._next_at:
            return
        self._next_at = clock + max(0.5, self.rng.expovariate(1.0 / self.mean_interval))
        kind = self._pick()
        if kind is not None:
            self._inject(kind)

    def _pick(self) -> str | None:
        for kind in reversed(self._first_round):
            if self._allowed(kind):
                self._first_round.remove(kind)
                return kind
        choices = [k for k in self.kinds if self._allowed(k)]
        if not choices:
            return None
        return self.rng.choices(choices, [WEIGHTS[k] for k in choices])[0]

    def _allowed(self, kind: str) -> bool:
        """Not a second database or broker action while one runs; servers rest between
        restarts (counted from the end of the last one)."""
        if kind in BLOCKING and self._busy is not None and not self._busy.done():
            return False
        last = self._last.get(kind)
        return last is None or time.monotonic() - last >= MIN_GAP.get(kind, 0.0)

    def _target(self) -> Child | None:
        running = [c for c in self.fleet.of("relay", "consumer") if c.running and not c.stopped]
        return self.rng.choice(running) if running else None

    def _inject(self, kind: str) -> None:
        self._last[kind] = time.monotonic()
        if kind == SIGKILL:
            child = self._target()
            if child is not None and child.kill():
                self.record(SIGKILL, child.name)
        elif kind == SIGSTOP:
            child = self._target()
            pause = round(self.rng.uniform(1.0, 8.0), 1)
            if child is not None and child.pause():
                self._resume_at.append((time.monotonic() + pause, child))
                self.record(SIGSTOP, child.name, f"{pause}s")
        elif kind == REBALANCE:
            consumers = self.fleet.of("consumer")
            if consumers:
                group = self.rng.choice(consumers).env["OUTBOXKIT_CONSUMER_GROUP"]
                extra = self.start_extra_consumer(group)
                stay = self.rng.uniform(3.0, 8.0)
                self._extras.append((time.monotonic() + stay, extra))
                self.record(REBALANCE, group, f"extra member for {stay:.1f}s")
        elif kind == KILL_POINT:
            self._arm()
        elif kind == TERMINATE_BACKENDS:
            self._run_blocking(self._terminate_backends)
        elif kind == BROKER_RESTART:
            self._run_blocking(self._restart_broker)
        elif kind == PG_RESTART:
            self._run_blocking(self._restart_postgres)

    def _arm(self) -> None:
        """Restart one relay or consumer with a fault point armed; it is counted when it fires."""
        child = self._target()
        if child is None:
            return
        points = RELAY_POINTS if child.role == "relay" else CONSUMER_POINTS
        if child.role == "relay":  # the run's relays use one producer per shard: slot 0
            points = tuple(p for p in points if "_slot" not in p or p.endswith("slot0"))
        # Stopped with SIGTERM (not a fault); the supervisor starts it again with the point armed.
        child.next_fault = f"{self.rng.choice(points)}:{self.rng.randint(1, 3)}"
        child.ask_to_stop()

    def _run_blocking(self, action: Callable[[], None]) -> None:
        """Server restarts take seconds: in a thread, while the loop keeps supervising. One
        thread for the whole run: a server dies with the thread that started it
        (``PR_SET_PDEATHSIG``), so that thread must outlive the run."""
        self._busy = _SERVER_THREAD.submit(action)

    def _terminate_backends(self) -> None:
        everyone = self.stack is not None and self.stack.postgres is not None
        condition = "" if everyone else " AND application_name LIKE %(prefix)s"
        try:
            with db.connect(self.database_url, connect_timeout=5) as conn:
                row = conn.execute(
                    "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                    " AND backend_type = 'client backend'" + condition,
                    {"prefix": self.application_prefix + "%"},
                ).fetchone()
        except psycopg.Error as exc:
            self.record(TERMINATE_BACKENDS, "postgresql", f"failed: {type(exc).__name__}")
            return
        scope = "all client backends" if everyone else "the run's backends"
        self.record(TERMINATE_BACKENDS, "postgresql", f"{row[0] if row else 0} of {scope}")

    def _restart_broker(self) -> None:
        assert self.stack is not None
        assert self.stack.kafka is not None
        self._restart(BROKER_RESTART, "kafka", self.stack.kafka)

    def _restart_postgres(self) -> None:
        assert self.stack is not None
        assert self.stack.postgres is not None
        self._restart(PG_RESTART, "postgresql", self.stack.postgres)

    def _restart(self, kind: str, target: str, server: ManagedServer) -> None:
        """Stop (gracefully: the dev stack does not fsync) and start again, patiently: on a
        busy machine a broker can take minutes to come back."""
        started = time.monotonic()
        try:
            server.stop()
        except OutboxkitError as exc:
            self.errors.append(f"{target} did not stop: {exc}")
        problem = self._start(server)
        if problem is None:
            self._last[kind] = time.monotonic()  # the rest between restarts starts now
            self.record(kind, target, f"down {time.monotonic() - started:.1f}s")
        else:  # started again before the drain (see _heal), or the run fails there
            self.notes.append(f"{target} did not start again in time: {problem}")

    def _start(self, server: ManagedServer) -> str | None:
        """Start the server (three tries); the problem when it did not come up."""
        problem = "not started"
        for _ in range(3):
            if server.service is not None:
                server.service.start_timeout = RESTART_TIMEOUT
            try:
                server.start()
                return None
            except OutboxkitError as exc:
                problem = str(exc).splitlines()[0]
        return problem

    def _heal(self) -> None:
        """Every self-started server up again (a restart that failed is tried once more)."""
        if self.stack is None:
            return
        for target, server in (("kafka", self.stack.kafka), ("postgresql", self.stack.postgres)):
            service = server.service if server is not None else None
            if server is None or (service is not None and service.is_running()):
                continue
            problem = self._start(server)
            if problem is not None:
                self.errors.append(f"{target} is down and does not start: {problem}")

    def finish(self) -> None:
        """Let a restart in progress end, continue stopped processes, let extra members go."""
        if self._busy is not None:
            self._busy.result(3 * RESTART_TIMEOUT + 60)
        _SERVER_THREAD.submit(self._heal).result(3 * RESTART_TIMEOUT + 60)
        for _, child in self._resume_at:
            child.resume()
        self._resume_at.clear()
        for _, child in self._extras:
            child.ask_to_stop()
        self._extras.clear()
