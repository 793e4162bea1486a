"""``outboxkit verify``: a seeded fault-injection run that checks every guarantee, or the check
of a history file written by an earlier run (``--check``)."""

from __future__ import annotations

import logging
import random
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

import click

from outboxkit.cli.options import finite

UNREADABLE_HISTORY = 2  # no verdict: distinct from 1, "anomalies found" (docs/verify.md)

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|sec|m|min|h)?\s*$")
_UNIT = {None: 1.0, "s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}


class _UnreadableHistory(click.ClickException):
    exit_code = UNREADABLE_HISTORY


#: The longest run: a week of faults is a soak; a longer one overflowed the waits it is cut into.
MAX_DURATION_SECONDS = 7 * 24 * 3600.0


def parse_duration(text: str) -> float:
    """``60``, ``60s``, ``10m``, ``1h`` to seconds."""
    match = _DURATION.match(text)
    if match is None or float(match.group(1)) <= 0:
        raise click.BadParameter(f"{text!r} is not a duration such as 60, 60s, 10m or 1h")
    seconds = float(match.group(1)) * _UNIT[match.group(2)]
    if seconds > MAX_DURATION_SECONDS:
        raise click.BadParameter(f"{text!r} is longer than a week (168h)")
    return seconds


def _duration(ctx: click.Context, param: click.Parameter, value: str) -> float:
    return parse_duration(value)


@click.command()
@click.option(
    "--duration",
    callback=_duration,
    default="60s",
    show_default=True,
    help="How long faults are injected: 60, 60s, 10m, 1h.",
)
@click.option("--seed", type=int, help="Seed of every random choice (default: random, printed).")
@click.option("--writers", type=click.IntRange(1, 32), default=3, show_default=True)
@click.option("--relays", type=click.IntRange(1, 16), default=2, show_default=True)
@click.option(
    "--consumers",
    type=click.IntRange(2, 32),
    default=4,
    show_default=True,
    help="Consumer processes, split between the confluent-kafka and aiokafka clients.",
)
@click.option(
    "--rate",
    type=click.FloatRange(0.1, 1000),
    callback=finite,
    default=10.0,
    show_default=True,
    help="Write attempts per second per writer.",
)
@click.option(
    "--dev",
    is_flag=True,
    help="Start PostgreSQL and Kafka here even when OUTBOXKIT_* names others.",
)
@click.option(
    "--history",
    "history_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the run's history here as JSON (to re-check or replay it).",
)
@click.option(
    "--check",
    "check_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Only check a history file written by an earlier run.",
)
@click.option(
    "--workdir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Where process logs go (default: a temporary directory, kept on failure).",
)
def verify(
    duration: float,
    seed: int | None,
    writers: int,
    relays: int,
    consumers: int,
    rate: float,
    dev: bool,
    history_path: Path | None,
    check_path: Path | None,
    workdir: Path | None,
) -> None:
    """Inject faults into writers, relays, consumers, Kafka and PostgreSQL; check the guarantees.

    Exits 1 when any anomaly is found, 2 when the --check history cannot be read. Without
    OUTBOXKIT_DATABASE_URL and a Kafka bootstrap (or with --dev), PostgreSQL and Kafka are
    started here, and then restarted as faults too.
    """
    from outboxkit.verify import History, HistoryFormatError, check

    if check_path is not None:
        try:
            history = History.from_json(check_path.read_bytes())
        except (HistoryFormatError, OSError) as exc:
            error = _UnreadableHistory(f"cannot check {check_path}: {exc}")
        else:
            report = check(history, exactly_once=history.params.mode == "exactly_once")
            _finish(report.summary_lines(), report.ok)
            return
        raise error  # outside the except block: one line, no traceback context
    seed = seed if seed is not None else random.SystemRandom().randrange(1, 10**9)
    _quiet_clients()
    from outboxkit.verify.layout import RunConfig
    from outboxkit.verify.run import Run
    from outboxkit.verify.target import open_target

    own_dir = workdir is None
    workdir = workdir or Path(tempfile.mkdtemp(prefix=f"outboxkit-verify-{seed}-"))
    config = RunConfig(
        seed=seed,
        duration=duration,
        workdir=workdir,
        writers=writers,
        relays=relays,
        consumers=consumers,
        rate=rate,
    )
    started = time.monotonic()
    with open_target(dev, click.echo) as target:
        click.echo(
            f"outboxkit verify: seed {seed}, {duration:g}s of faults, {writers} writers,"
            f" {relays} relays, {consumers} consumers ({target.self_started} services)"
        )
        run = Run(config, target, click.echo)
        history, report = run.execute()
    if history_path is not None:
        history_path.write_text(history.to_json())
    lines = report.summary_lines()
    lines.insert(
        1,
        f"{'run':<12}{time.monotonic() - started:.0f}s in all;"
        f" replay: outboxkit verify --seed {seed} --duration {duration:g} --writers {writers}"
        f" --relays {relays} --consumers {consumers} --rate {rate:g}{' --dev' if dev else ''}",
    )
    ok = report.ok and not run.problems
    exits = run.fleet.unexpected_exits
    after_faults = next(i for i, line in enumerate(lines) if line.startswith("faults")) + 1
    lines.insert(
        after_faults,
        f"{'processes':<12}{run.fleet.restarts} restarts by the run's supervisor;"
        f" {len(exits)} exits not caused by a fault{': ' + exits[0] + ', ...' if exits else ''}",
    )
    lines += [f"{'note':<12}{note}" for note in run.notes]
    lines += [f"{'run problem':<12}{problem}" for problem in run.problems]
    if run.problems:
        lines.append(f"{'result':<12}FAIL (the run itself)")
    if history_path is not None:
        lines.append(f"{'history':<12}{history_path}")
    if ok and own_dir:
        shutil.rmtree(workdir, ignore_errors=True)
    else:
        lines.append(f"{'logs':<12}{workdir}")
    _finish(lines, ok)


def _quiet_clients() -> None:
    """Client libraries log reconnects while the broker restarts: not for the summary."""
    for name in ("outboxkit", "aiokafka", "kafka", "outboxkit.devstack"):
        logging.getLogger(name).setLevel(logging.CRITICAL)


def _finish(lines: list[str], ok: bool) -> None:
    for line in lines:
        click.echo(line)
    sys.stdout.flush()
    if not ok:
        raise SystemExit(1)
