"""The pure parts of ``outboxkit verify``'s runner: durations, the seeded fault schedule, the
history check from a file, reading the writers' records back, and when the drain is done."""

from __future__ import annotations

import json
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from outboxkit.cli import main
from outboxkit.cli.verify import parse_duration
from outboxkit.verify import WriteOp, WriteOutcome
from outboxkit.verify.collect import Progress, read_writes
from outboxkit.verify.nemesis import KILL_POINT, Nemesis
from outboxkit.verify.procs import Child, Fleet
from tests.unit.test_verify_checker import clean


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("60", 60.0), ("60s", 60.0), ("10m", 600.0), ("1.5m", 90.0), ("1h", 3600.0)],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "0", "-5", "10x", "m", "ten minutes"])
def test_bad_durations_are_refused(text: str) -> None:
    with pytest.raises(click.BadParameter):
        parse_duration(text)


def _nemesis(seed: int) -> Nemesis:
    return Nemesis(
        seed=seed,
        fleet=Fleet(),
        database_url="postgresql://unused",
        application_prefix="okv-test",
        start_extra_consumer=lambda group: Child("x", "extra-consumer", [], {}, Path("x.log")),
    )


def _schedule(seed: int, steps: int = 40) -> list[str | None]:
    nemesis = _nemesis(seed)
    return [nemesis._pick() for _ in range(steps)]


def test_a_seed_names_one_fault_schedule() -> None:
    assert _schedule(7) == _schedule(7)
    assert _schedule(7) != _schedule(8)


def test_the_first_round_covers_every_kind_armed_point_first() -> None:
    nemesis = _nemesis(3)
    first = [nemesis._pick() for _ in nemesis.kinds]
    assert first[0] == KILL_POINT
    assert sorted(k for k in first if k) == sorted(nemesis.kinds)
    # Without a self-started stack, no server is restarted.
    assert "broker_restart" not in nemesis.kinds
    assert "pg_restart" not in nemesis.kinds


def test_check_of_a_history_file_fails_on_an_anomaly(tmp_path: Path) -> None:
    fine = tmp_path / "fine.json"
    fine.write_text(clean().h.to_json())
    result = CliRunner().invoke(main, ["verify", "--check", str(fine)])
    assert result.exit_code == 0, result.output
    assert "result      PASS" in result.output
    run = clean()
    lost = run.write("k9", publish=False)  # committed, never published
    broken = tmp_path / "lost.json"
    broken.write_text(run.h.to_json())
    result = CliRunner().invoke(main, ["verify", "--check", str(broken)])
    assert result.exit_code == 1, result.output
    assert f"lost                        1  {lost.event_id}" in result.output
    assert "result      FAIL" in result.output


def test_writer_records_are_read_back_with_their_outcomes(tmp_path: Path) -> None:
    path = tmp_path / "writes-0.jsonl"
    op = WriteOp("w", "e1", "ik-e1", "t", "k", "00", WriteOutcome.UNKNOWN)
    line = json.dumps({**op.__dict__, "outcome": op.outcome.value, "time": 2.0})
    path.write_text(f"{line}\n" + '{"writer": "w", "event_id": "half-writ')  # killed mid-line
    ops = read_writes([path, tmp_path / "missing.jsonl"])
    assert [(o.event_id, o.outcome) for o in ops] == [("e1", WriteOutcome.UNKNOWN)]


CONSUMERS = ("confluent", "aiokafka")


@pytest.mark.parametrize(
    ("states", "drained"),
    [
        ({"published": 5}, True),
        ({"published": 5, "pending": 1}, False),
        # moved out of the claims' way, still to be sent
        ({"published": 5, "held": 1}, False),
        ({"published": 5, "scheduled": 1}, False),
        # never sent without an operator: not expected at the consumers
        ({"published": 5, "parked": 2, "discarded": 1}, True),
        ({"published": 5, "some_later_state": 1}, False),
    ],
)
def test_the_drain_waits_for_every_row_not_in_a_final_state(
    states: dict[str, int], drained: bool
) -> None:
    now = Progress.of(states, dict.fromkeys(CONSUMERS, 5), CONSUMERS)
    assert now.drained is drained


def test_the_drain_waits_for_every_consumer_to_settle_what_was_published() -> None:
    states = {"published": 5, "parked": 3}
    assert not Progress.of(states, {"confluent": 5, "aiokafka": 4}, CONSUMERS).drained
    assert not Progress.of(states, {"confluent": 5}, CONSUMERS).drained  # one settled nothing
