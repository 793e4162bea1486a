"""Fencing tokens as they change during the run, sampled from the database in a thread.

The checker needs tokens over time to prove they only grow: relay lease tokens per (group,
shard) and inbox lease tokens per (consumer, event). A sample that fails (the database is being
restarted, the backend was terminated) is skipped; the sampler reconnects and goes on.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import psycopg

from outboxkit import db
from outboxkit.verify.history import InboxTokenObservation, RelayTokenObservation

OBSERVER = "sampler"


@dataclass
class TokenSampler:
    database_url: str
    schema: str
    relay_group: str
    consumers: list[str]
    t0: float
    interval: float = 0.5
    relay: list[RelayTokenObservation] = field(default_factory=list)
    inbox: list[InboxTokenObservation] = field(default_factory=list)
    failures: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _seen: dict[tuple[str, str], int] = field(default_factory=dict)  # last token per lease

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="token-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
        self.sample_once()  # the final tokens, after everything stopped

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample_once()

    def sample_once(self) -> None:
        try:
            with db.connect(self.database_url, connect_timeout=3) as conn:
                self._sample(conn)
        except (psycopg.Error, OSError):
            self.failures += 1

    def _sample(self, conn: psycopg.Connection[Any]) -> None:
        at = round(time.monotonic() - self.t0, 3)
        rows = conn.execute(
            f"SELECT shard, token FROM {self.schema}.relay_lease WHERE relay_group = %s"
            " ORDER BY shard",
            (self.relay_group,),
        ).fetchall()
        for shard, token in rows:
            if self._seen.get(("", str(shard))) == int(token):
                continue
            self._seen[("", str(shard))] = int(token)
            self.relay.append(
                RelayTokenObservation(
                    group=self.relay_group,
                    shard=int(shard),
                    token=int(token),
                    time=at,
                    observer=OBSERVER,
                )
            )
        # Only rows whose token changed since the last sample, to keep the history small.
        rows = conn.execute(
            f"SELECT consumer, event_id, lease_token FROM {self.schema}.inbox_message"
            " WHERE consumer = ANY(%s) AND lease_token IS NOT NULL"
            " AND updated_at > now() - interval '5 seconds'",
            (self.consumers,),
        ).fetchall()
        for consumer, event_id, token in rows:
            pair = (str(consumer), str(event_id))
            if self._seen.get(pair) == int(token):
                continue
            self._seen[pair] = int(token)
            self.inbox.append(
                InboxTokenObservation(
                    consumer=pair[0],
                    event_id=pair[1],
                    token=int(token),
                    time=at,
                    observer=OBSERVER,
                )
            )
