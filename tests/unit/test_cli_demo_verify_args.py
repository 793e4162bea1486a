"""``demo`` and ``verify`` refuse numbers they cannot run with (exit 2, before any service
starts), and ``demo`` says in one line why it cannot write its logs."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from outboxkit.cli import main

pytestmark = pytest.mark.unit

REFUSED = [
    ["verify", "--rate", "nan"],
    ["verify", "--duration", "99999999999999h"],
    ["demo", "--seconds", "-1"],
    ["demo", "--seconds", "nan"],
    ["demo", "--seconds", "inf"],
    ["demo", "--writers", "0"],
    ["demo", "--orders", "-1"],
]


class _Started(Exception):
    """Raised where a run would start its services: the arguments got through."""


@pytest.fixture(autouse=True)
def no_services(monkeypatch: pytest.MonkeyPatch) -> None:
    import outboxkit.devstack
    import outboxkit.verify.target

    def started(*_: object, **__: object) -> None:
        raise _Started

    monkeypatch.setattr(outboxkit.devstack, "DevStack", started)
    monkeypatch.setattr(outboxkit.verify.target, "open_target", started)


@pytest.mark.parametrize("args", REFUSED, ids=" ".join)
def test_refused_before_anything_starts(args: list[str]) -> None:
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    assert "Invalid value" in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_a_log_dir_that_cannot_be_made_is_one_line() -> None:
    result = CliRunner().invoke(main, ["demo", "--log-dir", "/proc/nope"])
    assert result.exit_code == 1, result.output
    assert result.output.startswith("Error: cannot write the logs to /proc/nope: ")
    assert "Traceback" not in result.output
    assert isinstance(result.exception, SystemExit)
