"""Every command's --help works without any configuration (walks the whole click tree)."""

from __future__ import annotations

import os

import click
import pytest
from click.testing import CliRunner

from outboxkit.cli import main


def _paths(group: click.Group, ctx: click.Context, prefix: list[str]) -> list[list[str]]:
    found = [prefix]
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        assert command is not None, name
        if isinstance(command, click.Group):
            found += _paths(command, click.Context(command, parent=ctx), [*prefix, name])
        else:
            found.append([*prefix, name])
    return found


PATHS = _paths(main, click.Context(main), [])


def test_the_tree_is_walked() -> None:
    assert ["outbox", "parked"] in PATHS
    assert ["migrate", "grants"] in PATHS
    assert ["relay", "shards"] in PATHS
    assert len(PATHS) > 20


@pytest.mark.parametrize("path", PATHS, ids=lambda p: " ".join(p) or "outboxkit")
def test_help_needs_no_configuration(path: list[str], tmp_path: os.PathLike[str]) -> None:
    clean = {k: None for k in os.environ if k.startswith("OUTBOXKIT_")}
    runner = CliRunner(env=clean)
    result = runner.invoke(main, [*path, "--help"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.output


def test_a_command_without_its_database_url_is_a_one_line_usage_error() -> None:
    clean = {k: None for k in os.environ if k.startswith("OUTBOXKIT_")}
    result = CliRunner(env=clean).invoke(main, ["outbox", "parked"])
    assert result.exit_code == 2
    assert "--database-url" in result.output
    assert "Traceback" not in result.output


def test_inbox_run_batch_options_reach_the_consumer_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from outboxkit.inbox import worker

    seen = []
    monkeypatch.setattr(worker, "run", seen.append)
    clean = {k: None for k in os.environ if k.startswith("OUTBOXKIT_")}
    args = ["inbox", "run", "--consumer", "c", "--group", "g", "--topic", "t"]
    args += ["--database-url", "postgresql://u@h/db", "--bootstrap", "h:9092"]
    result = CliRunner(env=clean).invoke(
        main, [*args, "--batch-max-records", "7", "--batch-max-ms", "2.5"], catch_exceptions=False
    )
    assert result.exit_code == 0, result.output
    (settings,) = seen
    assert (settings.consumer.batch_max_records, settings.consumer.batch_max_ms) == (7, 2.5)
    refused = CliRunner(env=clean).invoke(main, [*args, "--batch-max-records", "65"])
    assert refused.exit_code != 0
    assert "batch_max_records" in refused.output
    assert "Traceback" not in refused.output


def _command(path: list[str]) -> click.Command:
    command: click.Command = main
    ctx = click.Context(main)
    for name in path:
        assert isinstance(command, click.Group)
        found = command.get_command(ctx, name)
        assert found is not None, name
        command, ctx = found, click.Context(found, parent=ctx)
    return command


def test_every_schema_option_reads_outboxkit_schema() -> None:
    """One settings model: a schema set in the environment reaches every command that takes
    ``--schema``: read by the option itself, or (no default: an override) by the settings
    model the command loads. The inbox commands once ignored it for a fixed default."""
    with_schema = []
    for path in PATHS:
        command = _command(path)
        for param in command.params:
            if isinstance(param, click.Option) and "--schema" in param.opts:
                with_schema.append(" ".join(path))
                own_default = isinstance(param.get_default(click.Context(command)), str)
                reads_it = param.envvar == "OUTBOXKIT_SCHEMA" or not own_default
                assert reads_it, " ".join(path)
    assert "inbox stats" in with_schema
    assert "outbox" in with_schema
    assert "migrate up" in with_schema
