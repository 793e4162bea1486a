"""The live view: counters read from the database, drawn in place on a terminal.

On a TTY the status block is redrawn in place a few times a second, with the story's events
(kills, takeover, restart) printed above it as they happen; elsewhere (CI, a pipe) a plain line
every couple of seconds, so a log stays readable.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from typing import Any, TextIO

from outboxkit import db
from outboxkit.schema import DEFAULT_SCHEMA


@dataclass(frozen=True)
class Sample:
    published: int
    consumed: int
    duplicates: int
    holder: str | None  # the lease holder's id (host:pid:nonce) while its lease is unexpired
    token: int | None
    acquired_at: Any  # datetime (database clock) of the current term
    db_now: Any
    # Relay processes polling for a lease: every relay keeps its one lease-attempt connection.
    relays_polling: int

    def holder_pid(self) -> int | None:
        parts = (self.holder or "").split(":")
        return int(parts[1]) if len(parts) >= 3 and parts[1].isdigit() else None


class Sampler:
    """One autocommit connection; a sample is one round trip."""

    def __init__(
        self, database_url: str, topic: str, consumer: str, relay_group: str, **options: Any
    ) -> None:
        self._conn = db.connect(database_url, **options)
        self._query = db.query("demo", "progress", DEFAULT_SCHEMA)
        self._params = {"topic": topic, "consumer": consumer, "group": relay_group}

    def sample(self) -> Sample:
        row = db.one(self._conn, self._query, self._params)
        assert row is not None
        return Sample(
            int(row[0]),
            int(row[1]),
            int(row[2]),
            row[3],
            None if row[4] is None else int(row[4]),
            row[5],
            row[6],
            int(row[7]),
        )

    def close(self) -> None:
        self._conn.close()


class Display:
    """Redraws the status block on a TTY; prints a line every ``every`` seconds otherwise."""

    def __init__(
        self, out: TextIO, started: float, *, tty: bool | None = None, every: float = 2.0
    ) -> None:
        self._out = out
        self._started = started
        self._tty = out.isatty() if tty is None else tty
        self._every = every
        self._drawn = 0  # lines of the status block currently on screen
        self._last_plain = 0.0
        self._last_status: list[str] = []

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self._started

    def event(self, text: str) -> None:
        """A story line (stays on screen, above the live block)."""
        self._clear()
        self._out.write(f"  [{self.elapsed:5.1f}s] {text}\n")
        if self._tty and self._last_status:
            self._draw(self._last_status)
        self._out.flush()

    def status(self, lines: list[str]) -> None:
        self._last_status = lines
        if self._tty:
            self._clear()
            self._draw(lines)
        elif time.monotonic() - self._last_plain >= self._every:
            self._last_plain = time.monotonic()
            self._out.write("  " + "; ".join(" ".join(line.split()) for line in lines) + "\n")
        self._out.flush()

    def finish(self) -> None:
        """Leave the last status on screen (TTY) and stop redrawing."""
        self._drawn = 0
        self._last_status = []

    def _draw(self, lines: list[str]) -> None:
        # A wrapped line would take two rows and break the redraw: cut to the terminal's width.
        width = shutil.get_terminal_size().columns - 1
        for line in lines:
            self._out.write("\x1b[2K" + line[:width] + "\n")
        self._drawn = len(lines)

    def _clear(self) -> None:
        if self._tty and self._drawn:
            self._out.write(f"\x1b[{self._drawn}F\x1b[J")
            self._drawn = 0


def status_lines(
    sample: Sample, written: int, rolled_back: int, names: dict[int, str], elapsed: float
) -> list[str]:
    pid = sample.holder_pid()
    holder = names.get(pid, f"pid {pid}") if pid is not None else "nobody (lease expired)"
    token = "-" if sample.token is None else str(sample.token)
    return [
        f"  [{elapsed:5.1f}s] written   {written:4d} events"
        f" ({rolled_back} transactions rolled back)",
        f"           published {sample.published:4d}; lease: {holder}, fencing token {token}",
        f"           consumed  {sample.consumed:4d}; duplicates suppressed: {sample.duplicates}",
    ]
