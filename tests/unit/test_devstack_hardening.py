"""Dev-stack hardening, pure parts: private files, owned directories, the reaper's refusal to
delete what is not its own, shell quoting, per-stack state files and visible external services."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from outboxkit.cli import main
from outboxkit.devstack import DevStack, SaslSslListener
from outboxkit.devstack.files import (
    MARKER_NAME,
    cache_dir,
    is_own_dir,
    make_owned_dir,
    write_private,
)
from outboxkit.devstack.registry import (
    make_registered_dir,
    reap_orphans,
    registry_dir,
    start_ticks,
    unregister_dir,
)
from outboxkit.devstack.stack import export_lines, redact_url
from outboxkit.devstack.state import DevUpState, live_states, pick_state, write_state
from outboxkit.errors import ConfigurationError, DevStackError

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def _private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The registry and state files of these tests never touch the user's real cache."""
    monkeypatch.setenv("OUTBOXKIT_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture
def owned() -> Iterator[tuple[Path, str]]:
    path, token = make_owned_dir("outboxkit-test-")
    try:
        yield path, token
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


# --- private files ---------------------------------------------------------------------------


def test_private_file_is_0600_even_with_an_open_umask(tmp_path: Path) -> None:
    previous = os.umask(0)
    try:
        write_private(tmp_path / "pw", "secret\n")
    finally:
        os.umask(previous)
    assert (tmp_path / "pw").stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "pw").read_text() == "secret\n"


def test_private_file_replaces_a_readable_file_and_never_writes_through_a_symlink(
    tmp_path: Path,
) -> None:
    readable = tmp_path / "state.json"
    readable.write_text("old")
    readable.chmod(0o644)
    write_private(readable, "new")
    assert readable.stat().st_mode & 0o777 == 0o600
    assert readable.read_text() == "new"

    victim = tmp_path / "victim"
    victim.write_text("untouched")
    link = tmp_path / "planted"
    link.symlink_to(victim)
    write_private(link, "secret")
    assert victim.read_text() == "untouched"
    assert not link.is_symlink()
    assert link.read_text() == "secret"
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


# --- owned directories and the reaper ----------------------------------------------------------


def test_an_owned_dir_is_recognised_only_with_its_token(owned: tuple[Path, str]) -> None:
    path, token = owned
    assert path.parent == Path(tempfile.gettempdir())
    assert path.name.startswith("outboxkit-")
    assert is_own_dir(path, token)
    assert not is_own_dir(path, "0" * 32)
    assert not is_own_dir(path, "")
    assert not is_own_dir(str(path.relative_to(path.parent)), token)


def test_directories_the_stack_did_not_make_are_not_its_own(
    owned: tuple[Path, str], tmp_path: Path
) -> None:
    path, token = owned
    # Outside the temp dir, even with a copied marker holding the right token.
    elsewhere = tmp_path / "outboxkit-copy"
    elsewhere.mkdir()
    (elsewhere / MARKER_NAME).write_text(token)
    assert not is_own_dir(elsewhere, token)
    # A symlink to our own directory.
    link = Path(tempfile.gettempdir()) / f"outboxkit-link-{os.getpid()}"
    link.symlink_to(path)
    try:
        assert not is_own_dir(link, token)
    finally:
        link.unlink()
    # Not named outboxkit-*, or not a directory, or the root.
    other = Path(tempfile.mkdtemp(prefix="someone-else-"))
    try:
        (other / MARKER_NAME).write_text(token)
        assert not is_own_dir(other, token)
    finally:
        shutil.rmtree(other)
    assert not is_own_dir("/", token)
    (path / MARKER_NAME).unlink()
    assert not is_own_dir(path, token)


def _register_orphan(directory: Path, token: str | None) -> Path:
    entry = registry_dir() / f"{_dead_pid()}.json"
    body = {"owner": _dead_pid(), "pid": int(entry.stem), "name": "x", "dir": str(directory)}
    if token is not None:
        body["token"] = token
    entry.write_text(json.dumps(body))
    return entry


def test_reaper_deletes_its_own_directory(owned: tuple[Path, str]) -> None:
    path, token = owned
    entry = _register_orphan(path, token)
    reap_orphans()
    assert not path.exists()
    assert not entry.exists()


def test_reaper_never_deletes_a_directory_it_did_not_make(
    tmp_path: Path, owned: tuple[Path, str], caplog: pytest.LogCaptureFixture
) -> None:
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "data").write_text("keep me")
    path, token = owned
    entries = [
        _register_orphan(precious, token),  # an arbitrary path, with a real token
        _register_orphan(precious, None),  # a caller-chosen directory (no token)
        _register_orphan(path, "f" * 32),  # our kind of directory, but not this entry's
    ]
    with caplog.at_level(logging.INFO, logger="outboxkit.devstack"):
        reap_orphans()
    assert (precious / "data").read_text() == "keep me"
    assert is_own_dir(path, token)
    assert not any(entry.exists() for entry in entries)
    assert "did not create it" in caplog.text


def test_reaper_does_not_kill_a_process_that_reused_a_pid() -> None:
    sleeper = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        ticks = start_ticks(sleeper.pid)
        assert ticks is not None
        entry = registry_dir() / f"{sleeper.pid}.json"
        body = {"owner": _dead_pid(), "pid": sleeper.pid, "ticks": ticks - 1, "name": "old"}
        entry.write_text(json.dumps(body))
        assert reap_orphans() == 0
        assert sleeper.poll() is None
        assert not entry.exists()
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_registered_directory_is_reaped_once_its_owner_died_before_any_service() -> None:
    """A run killed in initdb or Kafka's format had started no service: its directory is in
    the registry from its creation, so the next run's reaper still removes it."""
    script = (
        "from outboxkit.devstack.registry import make_registered_dir;"
        " print(make_registered_dir('outboxkit-test-')[0])"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    orphan = Path(out.stdout.strip())
    assert orphan.is_dir()
    mine, _ = make_registered_dir("outboxkit-test-")  # its owner, this process, lives
    try:
        assert reap_orphans() == 0
        assert not orphan.exists()
        assert mine.is_dir()
        assert [path.name for path in registry_dir().iterdir()] == [f"dir-{mine.name}.json"]
    finally:
        shutil.rmtree(mine, ignore_errors=True)
        unregister_dir(mine)
    assert list(registry_dir().iterdir()) == []


# --- dev env: quoting and one state file per stack ---------------------------------------------


def test_export_lines_survive_a_shell_round_trip(tmp_path: Path) -> None:
    nasty = {
        "OUTBOXKIT_DATABASE_URL": "postgresql://u:p'w$(touch pwned)`id`@h/db; rm -rf x",
        "OUTBOXKIT_KAFKA_SASL_PASSWORD": "a b\nc\\d\"e'",
        "OUTBOXKIT_KAFKA_BOOTSTRAP": "127.0.0.1:9092",
    }
    script = "\n".join(export_lines(nasty))
    script += '\nprintf "%s\\0" "$OUTBOXKIT_DATABASE_URL" "$OUTBOXKIT_KAFKA_SASL_PASSWORD"'
    script += ' "$OUTBOXKIT_KAFKA_BOOTSTRAP"'
    out = subprocess.run(["sh", "-c", script], cwd=tmp_path, capture_output=True, check=True).stdout
    assert out.decode().split("\0")[:3] == list(nasty.values())
    assert not (tmp_path / "pwned").exists()


def test_each_dev_up_has_its_own_state_file_and_stale_ones_go(tmp_path: Path) -> None:
    mine = write_state({"A": "1"}, ["PostgreSQL: here"], tmp_path)
    assert mine.name == f"dev-up-{os.getpid()}.json"
    assert mine.stat().st_mode & 0o777 == 0o600
    stale = tmp_path / f"dev-up-{_dead_pid()}.json"
    stale.write_text(json.dumps({"pid": int(stale.stem[7:]), "env": {"A": "old"}}))
    recycled = tmp_path / f"dev-up-{os.getppid()}.json"  # alive, but started at another time
    recycled.write_text(json.dumps({"pid": os.getppid(), "ticks": -5, "env": {"A": "x"}}))
    damaged = tmp_path / "dev-up-123.json"
    damaged.write_text("{not json")

    states = live_states(tmp_path)
    assert [s.pid for s in states] == [os.getpid()]
    assert states[0].env == {"A": "1"}
    assert sorted(p.name for p in tmp_path.iterdir()) == [mine.name]


def test_dev_env_needs_a_pid_when_several_stacks_run() -> None:
    one = DevUpState(pid=11, ticks=None, env={"A": "1"}, summary=["Kafka: k1"])
    two = DevUpState(pid=22, ticks=None, env={"A": "2"}, summary=["Kafka: k2"])
    assert pick_state([one], None) is one
    assert pick_state([one, two], 22) is two
    with pytest.raises(DevStackError, match="--pid") as several:
        pick_state([one, two], None)
    assert "pid 11" in str(several.value)
    assert "pid 22" in str(several.value)
    assert "Kafka: k2" in str(several.value)
    with pytest.raises(DevStackError, match="no running"):
        pick_state([], None)
    with pytest.raises(DevStackError, match="with pid 33"):
        pick_state([one, two], 33)


# --- external services are said, not silently used --------------------------------------------


def test_external_services_are_logged_and_described(caplog: pytest.LogCaptureFixture) -> None:
    environ = {
        "OUTBOXKIT_DATABASE_URL": "postgresql://app:hunter2@db.example:5432/app",
        "OUTBOXKIT_KAFKA_BOOTSTRAP": "kafka.example:9092",
    }
    with caplog.at_level(logging.WARNING, logger="outboxkit.devstack"):
        stack = DevStack().start(environ=environ)
    assert stack.postgres is None
    assert stack.kafka is None
    assert stack.external == {
        "postgresql": "OUTBOXKIT_DATABASE_URL",
        "kafka": "OUTBOXKIT_KAFKA_BOOTSTRAP",
    }
    assert "external server named by OUTBOXKIT_DATABASE_URL" in caplog.text
    assert "external broker named by OUTBOXKIT_KAFKA_BOOTSTRAP" in caplog.text
    described = "\n".join(stack.describe())
    assert "external, from OUTBOXKIT_DATABASE_URL" in described
    assert "external, from OUTBOXKIT_KAFKA_BOOTSTRAP" in described
    assert "hunter2" not in described + caplog.text
    assert stack.env() == environ


def test_an_external_sasl_ssl_kafka_must_be_fully_described() -> None:
    environ = {
        "OUTBOXKIT_DATABASE_URL": "postgresql://app@db/app",
        "OUTBOXKIT_KAFKA_BOOTSTRAP": "kafka.example:9093",
        "OUTBOXKIT_KAFKA_SASL_USERNAME": "app",
    }
    with pytest.raises(DevStackError) as missing:
        DevStack(kafka_security="sasl_ssl").start(environ=environ)
    for name in (
        "OUTBOXKIT_KAFKA_SECURITY_PROTOCOL=SASL_SSL",
        "OUTBOXKIT_KAFKA_SASL_PASSWORD",
        "OUTBOXKIT_KAFKA_SSL_CA_LOCATION",
    ):
        assert name in str(missing.value)
    assert "OUTBOXKIT_KAFKA_SASL_USERNAME" not in str(missing.value)


def test_sasl_ssl_listener_env_round_trip_and_repr_hides_the_password() -> None:
    listener = SaslSslListener(
        bootstrap="127.0.0.1:9093", username="u", password="pa55-word", ca_location="/ca.pem"
    )
    env = listener.env()
    assert env == {
        "OUTBOXKIT_KAFKA_BOOTSTRAP": "127.0.0.1:9093",
        "OUTBOXKIT_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "OUTBOXKIT_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
        "OUTBOXKIT_KAFKA_SASL_USERNAME": "u",
        "OUTBOXKIT_KAFKA_SASL_PASSWORD": "pa55-word",
        "OUTBOXKIT_KAFKA_SSL_CA_LOCATION": "/ca.pem",
    }
    assert SaslSslListener.from_env(env) == listener
    assert "pa55-word" not in repr(listener)
    stack = DevStack(kafka_security="sasl_ssl").start(
        environ={"OUTBOXKIT_DATABASE_URL": "postgresql://db/app", **env}
    )
    assert stack.kafka_sasl_ssl == listener
    assert stack.kafka_bootstrap == "127.0.0.1:9093"
    assert stack.env() == {"OUTBOXKIT_DATABASE_URL": "postgresql://db/app", **env}
    assert "pa55-word" not in "\n".join(stack.describe())


def test_redact_url_hides_only_the_password() -> None:
    assert redact_url("postgresql://u:s3cret@h:5432/db?sslmode=disable") == (
        "postgresql://u:***@h:5432/db?sslmode=disable"
    )
    assert redact_url("postgresql://u@h/db") == "postgresql://u@h/db"
    assert "s3cret" not in redact_url("postgresql://u:s3cret@[::1]:5432/db")


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://u@h/db?password=s3cret-pw",
        "postgresql://u@h/db?sslmode=prefer&sslpassword=s3cret-pw",
        "host=h user=u password=s3cret-pw dbname=db",
        "postgresql://u:s3cret%2Fpw@h/db",
    ],
)
def test_an_external_url_is_shown_without_any_spelling_of_its_password(url: str) -> None:
    stack = DevStack()
    stack._choose_external({"OUTBOXKIT_DATABASE_URL": url, "OUTBOXKIT_KAFKA_BOOTSTRAP": "k:9092"})
    shown = "\n".join([*stack.describe(), repr(stack)])
    assert "s3cret" not in shown, shown


# --- the cache directory -----------------------------------------------------------------------


def test_an_unusable_cache_location_is_a_one_line_error_naming_the_way_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    not_a_dir = tmp_path / "xdg-cache"
    not_a_dir.write_text("a regular file")
    monkeypatch.delenv("OUTBOXKIT_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(not_a_dir))
    with pytest.raises(ConfigurationError) as caught:
        cache_dir()
    assert str(not_a_dir / "outboxkit") in str(caught.value)
    assert "OUTBOXKIT_CACHE_DIR" in str(caught.value)

    result = CliRunner().invoke(main, ["dev", "env"])  # what a user sees: one line, no traceback
    assert result.exit_code == 1
    assert result.output.startswith("Error: the dev stack's cache directory")
    assert result.output.count("\n") == 1
    assert not isinstance(result.exception, ConfigurationError)
