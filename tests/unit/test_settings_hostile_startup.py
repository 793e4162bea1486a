"""Start-up of ``relay run`` and ``inbox run`` with settings that cannot work: one line saying
what is wrong (a shard that does not exist, a role without grants, a relative registry path),
never a traceback, never a relay that quietly does nothing."""

from __future__ import annotations

import logging
import os
import threading

import psycopg
import pytest
from click.testing import CliRunner

from outboxkit.cli import main
from outboxkit.errors import ConfigurationError
from outboxkit.inbox import startup
from outboxkit.inbox.worker import load_object
from outboxkit.relay.runner import Relay
from outboxkit.settings import Settings, load_settings

SECRET = "s3cret-LEAK"
URL = f"postgresql://relay:{SECRET}@127.0.0.1:1/app"
DENIED = "permission denied for schema outboxkit"


def _settings(**relay: object) -> Settings:
    return load_settings(
        overrides={"database": {"url": URL}, "kafka": {"bootstrap": "127.0.0.1:1"}, "relay": relay}
    )


def _relay(monkeypatch: pytest.MonkeyPatch, shard_count: int, **relay: object) -> Relay:
    monkeypatch.setattr(Relay, "_check_schema", lambda self: shard_count)
    return Relay(_settings(**relay))


# ------------------------------------------------------------------------------------- shards


async def test_no_requested_shard_existing_is_an_error_naming_the_range(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    relay = _relay(monkeypatch, 2, shards=(7, 9))
    with pytest.raises(ConfigurationError) as raised:
        await relay._shards()
    message = str(raised.value)
    assert "none of the shards asked for (7, 9) exists" in message
    assert "shards are 0..1" in message
    assert "OUTBOXKIT_RELAY_SHARDS" in message
    relay = _relay(monkeypatch, 2, shards=(7,))
    with pytest.raises(ConfigurationError):  # and run() ends with it, not with a quiet exit
        await relay.run()


async def test_shards_beyond_the_count_are_dropped_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The count may have been lowered (``relay shards N``) under a running deployment: the
    shards that remain still need their relay."""
    relay = _relay(monkeypatch, 2, shards=(1, 3, 0))
    with caplog.at_level(logging.WARNING, logger="outboxkit.relay.runner"):
        assert await relay._shards() == [1, 0]
    assert "shards 3 do not exist (the shard count is 2, shards are 0..1)" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="outboxkit.relay.runner"):
        assert await _relay(monkeypatch, 2, shards=(0, 1))._shards() == [0, 1]
        assert await _relay(monkeypatch, 3)._shards() == [0, 1, 2]
    assert caplog.text == ""


# ----------------------------------------------------------------- a server refusal at start-up


def _denied(*_: object) -> int:
    raise psycopg.errors.InsufficientPrivilege(DENIED)


async def test_the_relay_reports_missing_grants_as_such(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Relay, "_check_schema", _denied)
    with pytest.raises(ConfigurationError) as raised:
        await Relay(_settings())._start_up()
    message = str(raised.value)
    assert "the database URL is invalid" not in message
    assert DENIED in message
    assert "42501" in message
    assert SECRET not in message


async def test_the_relay_still_reports_a_malformed_url_as_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def malformed(*_: object) -> int:
        raise psycopg.ProgrammingError('invalid URI query parameter: "x"')

    monkeypatch.setattr(Relay, "_check_schema", malformed)
    with pytest.raises(ConfigurationError, match="the database URL is invalid: invalid URI"):
        await Relay(_settings())._start_up()


def test_the_consumer_reports_missing_grants_as_such(monkeypatch: pytest.MonkeyPatch) -> None:
    class Connection:
        def __enter__(self) -> Connection:
            return self

        def __exit__(self, *_: object) -> None:
            return None

    monkeypatch.setattr(startup.db, "connect", lambda *_, **__: Connection())
    monkeypatch.setattr(startup.migrator, "require_current", _denied)

    async def kafka_ok() -> None:
        return None

    with pytest.raises(ConfigurationError) as raised:
        startup.wait_until_ready(_settings(), kafka_ok, threading.Event())
    message = str(raised.value)
    assert "the database URL is invalid" not in message
    assert DENIED in message
    assert SECRET not in message


# ------------------------------------------------------------------------- the registry's path


@pytest.mark.parametrize("spec", [".x:y", "..pkg.mod:registry", "os\x00:path", "a b:c", "x:"])
def test_a_registry_spec_that_is_no_absolute_module_path_is_one_error(spec: str) -> None:
    with pytest.raises(ConfigurationError, match="is not of the form module:attribute"):
        load_object(spec)


def test_inbox_run_with_a_relative_registry_is_one_line() -> None:
    env: dict[str, str | None] = {k: None for k in os.environ if k.startswith("OUTBOXKIT_")}
    env["OUTBOXKIT_DATABASE_URL"] = URL
    args = ["inbox", "run", "--consumer", "c", "--group", "g", "--topic", "t"]
    result = CliRunner(env=env).invoke(main, [*args, "--registry", ".x:y"])
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    assert not isinstance(result.exception, TypeError)
    assert [line for line in result.output.splitlines() if line.strip()] == [
        "Error: '.x:y' is not of the form module:attribute (an absolute module path, such as"
        " package.module:registry)"
    ]
