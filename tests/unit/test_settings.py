"""The one settings model: sources and their order, secrets, errors, ``config show``, relay CLI."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, get_args

import pytest
from click.testing import CliRunner

from outboxkit.cli import main
from outboxkit.db import prompt_free
from outboxkit.db.engines import engine_options
from outboxkit.errors import ConfigurationError
from outboxkit.inbox.delivery import InboxSettings
from outboxkit.inbox.registry import EventRegistry
from outboxkit.settings import KafkaClient, Mode, OnPublish, ParkedKeyPolicy, load_settings

pytestmark = pytest.mark.unit

SECRET_URL = "postgresql://relay:s3cret-pw@db.example:5432/app"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only what a test sets: no OUTBOXKIT_* from the surrounding environment."""
    for name in list(os.environ):
        if name.startswith("OUTBOXKIT_"):
            monkeypatch.delenv(name)


def _toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "outboxkit.toml"
    path.write_text(text)
    return path


def test_sources_in_order_file_env_secret_files_overrides(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _toml(
        tmp_path,
        'schema = "from_file"\n'
        '[database]\nurl = "postgresql:///file"\n'
        '[kafka]\nbootstrap = "file:9092"\nclient = "aiokafka"\nsasl_username = "file-user"\n'
        'security_protocol = "SASL_SSL"\n'
        '[relay]\nbatch_size = 50\nmode = "at_least_once"\nlease_ttl = 9\n',
    )
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "OUTBOXKIT_KAFKA_SASL_PASSWORD").write_text("from-file-secret\n")
    (secrets / "OUTBOXKIT_RELAY_LEASE_TTL").write_text("12")
    (secrets / "unrelated").write_text("ignored")
    monkeypatch.setenv("OUTBOXKIT_SECRETS_DIR", str(secrets))
    monkeypatch.setenv("OUTBOXKIT_KAFKA_BOOTSTRAP", "env:9092")
    monkeypatch.setenv("OUTBOXKIT_KAFKA_SASL_PASSWORD", "from-env")
    monkeypatch.setenv("OUTBOXKIT_RELAY_SHARDS", "1,3")
    monkeypatch.setenv("OUTBOXKIT_RELAY_LEASE_TTL", "11")
    monkeypatch.setenv("OUTBOXKIT_SCHEMA", "from_env")
    monkeypatch.setenv("OUTBOXKIT_FAULT", "after_claim")  # not a setting: ignored
    settings = load_settings(
        path, overrides={"relay": {"batch_size": 7, "poll_interval": None}, "kafka": {}}
    )
    assert settings.database_url.get_secret_value() == "postgresql:///file"  # file
    assert settings.kafka.bootstrap == "env:9092"  # env over file
    assert settings.kafka.client is KafkaClient.AIOKAFKA
    assert settings.kafka.sasl_username == "file-user"  # sections merge across sources
    assert settings.kafka.sasl_password is not None
    assert settings.kafka.sasl_password.get_secret_value() == "from-file-secret"  # file wins
    assert settings.relay.lease_ttl == 12  # secret file over env over TOML
    assert settings.relay.batch_size == 7  # override
    assert settings.relay.poll_interval == 1.0  # an override of None is no override
    assert settings.relay.shards == (1, 3)
    assert settings.relay.mode is Mode.AT_LEAST_ONCE
    assert settings.relay.on_publish is OnPublish.MARK
    assert settings.relay.parked_key_policy is ParkedKeyPolicy.WAIT
    assert settings.schema_name == "from_env"


def test_config_file_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OUTBOXKIT_CONFIG", str(_toml(tmp_path, '[relay]\ngroup = "blue"\n')))
    assert load_settings().relay.group == "blue"
    assert load_settings(_toml(tmp_path, "")).relay.group == "default"  # an explicit path wins


def test_defaults_need_nothing() -> None:
    settings = load_settings()
    assert settings.schema_name == "outboxkit"
    assert settings.relay.metrics_host == "127.0.0.1"
    assert settings.relay.shards is None
    with pytest.raises(ConfigurationError, match="OUTBOXKIT_DATABASE_URL"):
        _ = settings.database_url


def test_off_values_and_json_properties(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OUTBOXKIT_RELAY_RETENTION_SECONDS", "forever")
    monkeypatch.setenv("OUTBOXKIT_RELAY_LISTEN", "false")
    monkeypatch.setenv("OUTBOXKIT_KAFKA_PROPERTIES", '{"linger.ms": "7", "sasl.oauth": "tok"}')
    settings = load_settings()
    assert settings.relay.retention_seconds is None
    assert settings.relay.listen is False
    assert settings.kafka.properties["linger.ms"].get_secret_value() == "7"
    assert "tok" not in repr(settings)
    assert "tok" not in json.dumps(settings.redacted())


def test_secrets_never_show_in_repr_redacted_or_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OUTBOXKIT_DATABASE_URL", SECRET_URL)
    monkeypatch.setenv("OUTBOXKIT_KAFKA_SECURITY_PROTOCOL", "SASL_SSL")
    monkeypatch.setenv("OUTBOXKIT_KAFKA_SASL_PASSWORD", "kafka-s3cret")
    settings = load_settings()
    shown = json.dumps(settings.redacted())
    for text in (repr(settings), str(settings), shown):
        assert "s3cret" not in text
    assert "relay:***@db.example" in shown  # the URL stays useful, its password does not
    monkeypatch.setenv("OUTBOXKIT_RELAY_BATCH_SIZE", "s3cret-not-a-number")
    with pytest.raises(ConfigurationError) as caught:
        load_settings()
    assert "s3cret" not in str(caught.value)
    assert "OUTBOXKIT_RELAY_BATCH_SIZE ([relay] batch_size)" in str(caught.value)


@pytest.mark.parametrize(
    ("name", "value", "named"),
    [
        ("OUTBOXKIT_RELAY_MODE", "s3cret-mode", "OUTBOXKIT_RELAY_MODE"),
        ("OUTBOXKIT_RELAY_SHARDS", "1,-2", "OUTBOXKIT_RELAY_SHARDS"),
        ("OUTBOXKIT_RELAY_SHARDS", "1,s3cret", "OUTBOXKIT_RELAY_SHARDS"),  # int() quotes it
        ("OUTBOXKIT_CONSUMER_KAFKA_OPTIONS", "s3cret{", "OUTBOXKIT_CONSUMER_KAFKA_OPTIONS"),
        ("OUTBOXKIT_RELAY_TYPO", "s3cret", "OUTBOXKIT_RELAY_TYPO"),
        ("OUTBOXKIT_KAFKA_PROPERTIES", "s3cret{", "OUTBOXKIT_KAFKA_PROPERTIES"),
        ("OUTBOXKIT_KAFKA_SECURITY_PROTOCOL", "s3cret", "OUTBOXKIT_KAFKA_SECURITY_PROTOCOL"),
        ("OUTBOXKIT_SCHEMA", "s3cret\n", "OUTBOXKIT_SCHEMA"),
        ("OUTBOXKIT_RELAY_BACKOFF_INITIAL", "99", "backoff_initial"),
    ],
)
def test_invalid_settings_name_the_setting_never_the_value(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str, named: str
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigurationError) as caught:
        load_settings()
    assert named in str(caught.value)
    assert "s3cret" not in str(caught.value)


def test_unreadable_sources_are_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigurationError, match="cannot read configuration file"):
        load_settings(_toml(tmp_path, "[relay\n"))
    monkeypatch.setenv("OUTBOXKIT_SECRETS_DIR", str(tmp_path / "missing"))
    with pytest.raises(ConfigurationError, match="OUTBOXKIT_SECRETS_DIR"):
        load_settings()


def test_the_shipped_example_configuration_is_valid(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OUTBOXKIT_DATABASE_URL", SECRET_URL)
    settings = load_settings(ROOT / "relay" / "relay.example.toml")
    assert settings.relay.mode is Mode.EXACTLY_ONCE
    assert settings.relay.metrics_port == 9400
    assert settings.kafka.bootstrap == "kafka:9092"


# ------------------------------------------------------------------------------ the CLI


def _invoke(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args), env=env)
    return result.exit_code, result.output


def test_config_show_prints_effective_settings_redacted(tmp_path: Path) -> None:
    path = _toml(
        tmp_path,
        '[kafka]\nbootstrap = "file:9092"\nsecurity_protocol = "SASL_SSL"\n'
        "[relay]\nbatch_size = 9\n",
    )
    env = {"OUTBOXKIT_DATABASE_URL": SECRET_URL, "OUTBOXKIT_KAFKA_SASL_PASSWORD": "kafka-s3cret"}
    code, out = _invoke("config", "show", "--config", str(path), "--json", env=env)
    assert code == 0, out
    shown = json.loads(out)
    assert shown["relay"]["batch_size"] == 9
    assert shown["kafka"]["bootstrap"] == "file:9092"
    assert shown["kafka"]["sasl_password"] == "**********"
    assert shown["schema"] == "outboxkit"
    code, text = _invoke("config", "show", "--config", str(path), env=env)
    assert code == 0, text
    assert "[relay]" in text
    assert "batch_size = 9" in text
    assert "s3cret" not in out + text


def test_config_show_reports_an_invalid_setting_in_one_line() -> None:
    code, out = _invoke("config", "show", env={"OUTBOXKIT_RELAY_LEASE_TTL": "-1"})
    assert code == 1
    assert "OUTBOXKIT_RELAY_LEASE_TTL" in out
    assert "Traceback" not in out


@pytest.mark.parametrize(
    "args",
    [
        ("relay", "--help"),
        ("relay", "run", "--help"),
        ("relay", "status", "--help"),
        ("relay", "pause", "--help"),
        ("config", "show", "--help"),
    ],
)
def test_help_needs_no_configuration(args: tuple[str, ...]) -> None:
    code, out = _invoke(*args)
    assert code == 0, out
    assert "Usage:" in out


def test_relay_commands_without_a_database_url_say_which_setting() -> None:
    for args in (("relay", "status"), ("relay", "run", "--kafka-bootstrap", "k:9092")):
        code, out = _invoke(*args)
        assert code == 1, out
        assert "OUTBOXKIT_DATABASE_URL" in out
        assert "Traceback" not in out


def test_connection_options_on_the_group_and_on_the_command() -> None:
    # No server listens on port 1: the URL reaches the connection attempt (and its password
    # does not reach the output), whether given before or after the command.
    url = "postgresql://u:s3cret-pw@127.0.0.1:1/db?connect_timeout=2"
    for args in (
        ("relay", "--database-url", url, "status"),
        ("relay", "status", "--database-url", url),
    ):
        code, out = _invoke(*args)
        assert code == 1, out
        assert "127.0.0.1" in out
        assert "s3cret" not in out
        assert "Traceback" not in out


# ------------------------------------------------------------------------- numbers: finite, bounded


def _float_settings() -> list[tuple[str, str]]:
    """(section, field) of every float setting, found in the model (a new one is covered too)."""
    from outboxkit.settings.models import ConsumerSettings, KafkaSettings, RelaySettings

    found = []
    for section, part in (
        ("kafka", KafkaSettings),
        ("relay", RelaySettings),
        ("consumer", ConsumerSettings),
    ):
        for name, field in part.model_fields.items():
            if field.annotation is float or set(get_args(field.annotation)) == {float, type(None)}:
                found.append((section, name))
    return found


FLOAT_SETTINGS = _float_settings()


def test_the_float_settings_are_found() -> None:
    for expected in (
        ("relay", "kafka_timeout"),
        ("relay", "lease_ttl"),
        ("relay", "retention_seconds"),
        ("consumer", "batch_max_ms"),
        ("consumer", "lease_seconds"),
        ("consumer", "dedup_window"),
    ):
        assert expected in FLOAT_SETTINGS


@pytest.mark.parametrize("value", ["inf", "-inf"])
@pytest.mark.parametrize(
    ("section", "name"), FLOAT_SETTINGS, ids=[".".join(f) for f in FLOAT_SETTINGS]
)
def test_every_float_setting_refuses_infinity(
    monkeypatch: pytest.MonkeyPatch, section: str, name: str, value: str
) -> None:
    variable = f"OUTBOXKIT_{section}_{name}".upper()
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigurationError) as caught:
        load_settings()
    assert f"{variable} ([{section}] {name})" in str(caught.value)


def test_infinity_from_the_toml_file_and_the_command_line_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match=r"\[relay\] kafka_timeout"):
        load_settings(_toml(tmp_path, "[relay]\nkafka_timeout = inf\n"))
    code, out = _invoke("inbox", "run", "--batch-max-ms", "inf", "--lease-seconds", "1e300")
    assert code == 1, out
    assert "OUTBOXKIT_CONSUMER_BATCH_MAX_MS" in out
    assert "OUTBOXKIT_CONSUMER_LEASE_SECONDS" in out
    assert "Traceback" not in out


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("OUTBOXKIT_RELAY_KAFKA_TIMEOUT", "2147484"),  # message.timeout.ms past a C int
        ("OUTBOXKIT_RELAY_LEASE_TTL", "1e13"),  # PostgreSQL: interval out of range
        ("OUTBOXKIT_RELAY_POLL_INTERVAL", "1e300"),
        ("OUTBOXKIT_RELAY_TRANSACTION_MAX_MS", "1e300"),
        ("OUTBOXKIT_RELAY_RETENTION_SECONDS", "3e11"),  # now() - it: timestamp out of range
        ("OUTBOXKIT_RELAY_MAX_BATCH_BYTES", str(2**42)),  # queue.buffering.max.kbytes past int
        ("OUTBOXKIT_RELAY_RETENTION_BATCH", str(2**63)),  # a LIMIT past bigint
        ("OUTBOXKIT_CONSUMER_BATCH_MAX_MS", "1e12"),  # a poll timeout in ms past a C int
        ("OUTBOXKIT_CONSUMER_LEASE_SECONDS", "1e12"),  # expires_at past year 9999
        ("OUTBOXKIT_CONSUMER_RETRY_DELAY", "1e300"),
        ("OUTBOXKIT_CONSUMER_OFFSET_COMMIT_INTERVAL", "1e300"),
        ("OUTBOXKIT_CONSUMER_RETENTION_WINDOW", "3e11"),
        ("OUTBOXKIT_CONSUMER_RETENTION_INTERVAL", "1e300"),
        ("OUTBOXKIT_CONSUMER_DEDUP_WINDOW", "3e11"),
        ("OUTBOXKIT_CONSUMER_METRICS_PORT", "70000"),
        ("OUTBOXKIT_CONSUMER_KAFKA_OPTIONS", '{"session.timeout.ms": 4294977296}'),
    ],
)
def test_values_that_would_overflow_downstream_are_refused(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigurationError) as caught:
        load_settings()
    assert name in str(caught.value)
    assert value not in str(caught.value)


def test_the_bounds_are_generous(monkeypatch: pytest.MonkeyPatch) -> None:
    day, century = "86400", str(100 * 365.25 * 86400)
    for name, value in {
        "OUTBOXKIT_RELAY_KAFKA_TIMEOUT": "300",
        "OUTBOXKIT_RELAY_LEASE_TTL": day,
        "OUTBOXKIT_RELAY_POLL_INTERVAL": day,
        "OUTBOXKIT_RELAY_BACKOFF_MAX": day,
        "OUTBOXKIT_RELAY_HOUSEKEEPING_INTERVAL": day,
        "OUTBOXKIT_RELAY_TRANSACTION_MAX_MS": "60000",
        "OUTBOXKIT_RELAY_RETENTION_SECONDS": century,
        "OUTBOXKIT_RELAY_MAX_BATCH_BYTES": str(2**30),
        "OUTBOXKIT_CONSUMER_BATCH_MAX_MS": "60000",
        "OUTBOXKIT_CONSUMER_LEASE_SECONDS": day,
        "OUTBOXKIT_CONSUMER_RETENTION_WINDOW": century,
        "OUTBOXKIT_CONSUMER_DEDUP_WINDOW": century,
        "OUTBOXKIT_CONSUMER_KAFKA_OPTIONS": '{"max.poll.interval.ms": 2147483647}',
    }.items():
        monkeypatch.setenv(name, value)
    settings = load_settings()
    assert settings.relay.kafka_timeout == 300
    assert settings.consumer.client_options() == {"max.poll.interval.ms": 2**31 - 1}


# ------------------------------------------------------- the consumer's Kafka options are secrets

OPTIONS = '{"sasl.oauthbearer.client.secret": "hunter2", "fetch.min.bytes": 7, "check.crcs": true}'


def test_kafka_options_values_never_show(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OUTBOXKIT_CONSUMER_KAFKA_OPTIONS", OPTIONS)
    settings = load_settings()
    shown = settings.redacted()  # what config show prints and the relay logs at start-up
    for text in (repr(settings), str(settings), repr(settings.consumer), json.dumps(shown)):
        assert "hunter2" not in text
    assert shown["consumer"]["kafka_options"] == {
        "sasl.oauthbearer.client.secret": "**********",
        "fetch.min.bytes": "**********",
        "check.crcs": "**********",
    }
    # ... while the client gets them as given, types included
    assert settings.consumer.client_options() == {
        "sasl.oauthbearer.client.secret": "hunter2",
        "fetch.min.bytes": 7,
        "check.crcs": True,
    }


def test_config_show_hides_kafka_options_values() -> None:
    env = {"OUTBOXKIT_CONSUMER_KAFKA_OPTIONS": OPTIONS}
    for args in (("config", "show"), ("config", "show", "--json")):
        code, out = _invoke(*args, env=env)
        assert code == 0, out
        assert "sasl.oauthbearer.client.secret" in out
        assert "hunter2" not in out


def test_inbox_run_hands_the_kafka_options_to_the_client_unchanged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from outboxkit.inbox import worker

    handed: dict[str, object] = {}
    monkeypatch.delenv("PGSERVICE", raising=False)  # a service file may give sslpassword instead
    monkeypatch.setattr(worker, "_started", lambda config: True)
    monkeypatch.setattr(
        worker,
        "_run_sync",
        lambda url, handler, settings, kafka, options, connect_args: handed.update(
            options, connect_args=connect_args
        ),
    )
    monkeypatch.setattr(worker, "resolve_client", lambda kafka: KafkaClient.CONFLUENT)
    code, out = _invoke(
        "inbox",
        *("run", "--consumer", "c", "--group", "g", "--topic", "t", "--handler", "json:dumps"),
        *("--kafka-option", "sasl.oauthbearer.client.secret=hunter2"),
        *("--kafka-option", "fetch.min.bytes=7"),
        env={"OUTBOXKIT_DATABASE_URL": SECRET_URL, "OUTBOXKIT_CONSUMER_GC_TUNING": "false"},
    )
    assert code == 0, out
    assert handed["config"] == {"sasl.oauthbearer.client.secret": "hunter2", "fetch.min.bytes": 7}
    no_prompt = prompt_free(SECRET_URL)  # libpq never asks the terminal for a key's pass phrase
    assert no_prompt  # (this libpq knows sslpassword)
    # psycopg's own prepared statements by default, the sessions named after the consumer; the
    # engine adds the no-prompt option and UTF8 text
    assert handed["connect_args"] == {
        "fallback_application_name": "outboxkit-inbox-c",
        "connect_timeout": 10,
    }
    assert engine_options(SECRET_URL, {}) == {
        "client_encoding": "UTF8",
        **no_prompt,
        "connect_timeout": 10,
    }
    code, out = _invoke(
        "inbox",
        *("run", "--consumer", "c", "--group", "g", "--topic", "t", "--handler", "json:dumps"),
        env={
            "OUTBOXKIT_DATABASE_URL": SECRET_URL,
            "OUTBOXKIT_CONSUMER_GC_TUNING": "false",
            "OUTBOXKIT_DATABASE_PREPARED_STATEMENTS": "false",  # behind an older PgBouncer
        },
    )
    assert code == 0, out
    assert handed["connect_args"] == {
        "fallback_application_name": "outboxkit-inbox-c",
        "connect_timeout": 10,
        "prepare_threshold": None,
    }
    assert engine_options(SECRET_URL, {"prepare_threshold": None}) == {
        "client_encoding": "UTF8",
        **no_prompt,
        "connect_timeout": 10,
        "prepare_threshold": None,
    }


class _Made(Exception):
    """Raised by the recording engine maker: the worker went no further."""


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_inbox_run_makes_its_engine_through_the_seam_with_its_connect_args(
    monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """The engine of ``inbox run`` comes from ``outboxkit.db.engines`` (which adds the
    no-prompt option) with the URL and the database settings' options."""
    import asyncio
    import signal

    from outboxkit.inbox import worker

    made: list[tuple[object, object]] = []

    def maker(url: object, *, connect_args: object = None, **options: object) -> object:
        made.append((url, connect_args))
        raise _Made

    monkeypatch.setattr(worker, f"{kind}_engine", maker)
    monkeypatch.setattr(signal, "signal", lambda *args: None)  # the test process's own stay
    options = {"prepare_threshold": None}
    inbox = InboxSettings(consumer="c", registry=EventRegistry())
    args: tuple[Any, ...] = (
        SECRET_URL,
        None,
        inbox,
        None,
        {"group_id": "g", "topics": []},
        options,
    )

    def run() -> None:
        if kind == "sync":
            worker._run_sync(*args)
        else:
            asyncio.run(worker._run_async(*args))

    with pytest.raises(_Made):
        run()
    assert made == [(SECRET_URL, options)]


def test_a_malformed_kafka_option_item_is_named_without_its_text() -> None:
    code, out = _invoke(
        "inbox", "run", "--kafka-option", "a=1", "--kafka-option", "sasl.password:hunter2"
    )
    assert code == 2, out
    assert "--kafka-option" in out
    assert "item 2" in out
    assert "hunter2" not in out
    assert "sasl.password" not in out  # the item's text, whatever part of it is the secret


# ------------------------------------------------------------------ the dead-letter topic template


@pytest.mark.parametrize(
    "template", ["{topic}.{x}", "{0}", "{}", "{topic!r}", "{topic:>9}", "{topic.upper}", "{topic"]
)
def test_a_dead_letter_template_that_cannot_be_filled_is_refused(
    monkeypatch: pytest.MonkeyPatch, template: str
) -> None:
    monkeypatch.setenv("OUTBOXKIT_CONSUMER_DEAD_LETTER", template)
    with pytest.raises(ConfigurationError, match="OUTBOXKIT_CONSUMER_DEAD_LETTER"):
        load_settings()


@pytest.mark.parametrize("template", ["{topic}.dlq", "dead-letters", ""])
def test_dead_letter_templates_that_work_are_kept(
    monkeypatch: pytest.MonkeyPatch, template: str
) -> None:
    monkeypatch.setenv("OUTBOXKIT_CONSUMER_DEAD_LETTER", template)
    assert load_settings().consumer.dead_letter == template
