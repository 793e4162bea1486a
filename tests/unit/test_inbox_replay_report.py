"""``inbox replay``'s output is written as the run goes: the ``--json`` document, written event
by event, is one valid document however the run ends, and the text shows every outcome."""

from __future__ import annotations

import json

import click
from click.testing import CliRunner

from outboxkit.cli.inbox_replay import _Report
from outboxkit.inbox.replay import FAILED, REPLAYED, Outcome, Replay, targets


def _run() -> Replay:
    return Replay(
        "billing",
        None,
        targets("payments.dlq", ()),
        state_of=lambda e: None,
        forget=lambda e: True,
        publish=lambda letter: None,
    )


def _output(outcomes: list[Outcome], *, as_json: bool, error: str | None = None) -> str:
    @click.command()
    def show() -> None:
        run = _run()
        report = _Report(as_json, "billing", "payments.dlq", False)
        for outcome in outcomes:
            run.counts[outcome.action] += 1
            report.event(outcome)
        report.end(run, error)

    result = CliRunner().invoke(show, [])
    assert result.exit_code == 0, result.output
    return result.output


def test_the_streamed_json_document_is_valid_with_no_one_or_many_events() -> None:
    one = Outcome("e1", "payments.dlq/0/0", REPLAYED, "to payments")
    two = Outcome("e2", "payments.dlq/0/1", FAILED, "publish failed; run the replay again")
    for outcomes in ([], [one], [one, two]):
        document = json.loads(_output(outcomes, as_json=True))
        assert document["consumer"] == "billing"
        assert document["dead_letter_topic"] == "payments.dlq"
        assert [e["event_id"] for e in document["events"]] == [o.event_id for o in outcomes]
        assert document["summary"]["repeated_dead_letters"] == 0
        assert document["summary"]["not_remembered"] == 0
        assert "error" not in document


def test_a_run_stopped_early_still_ends_the_document_with_why() -> None:
    one = Outcome("e1", "payments.dlq/0/0", REPLAYED, "to payments")
    document = json.loads(_output([one], as_json=True, error="the read stopped"))
    assert document["error"] == "the read stopped"
    assert document["summary"][REPLAYED] == 1


def test_text_is_a_line_per_outcome_and_a_summary() -> None:
    one = Outcome("e1\x1b[2J", "payments.dlq/0/0", REPLAYED, "to payments")
    lines = _output([one], as_json=False).splitlines()
    assert lines == [
        "e1\\x1b[2J  replayed  (dead letter payments.dlq/0/0): to payments",
        "billing: 1 dead events on payments.dlq (1 replayed; 0 repeated dead letters)",
    ]
