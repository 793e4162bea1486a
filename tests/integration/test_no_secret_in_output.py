"""No secret in any output: every command that connects, fed bad URLs, bad passwords and bad Kafka
credentials, prints (stdout, stderr, logs, the exception a user would see) none of them.

Cases: a password with a bad ``%`` escape (libpq quotes the connection string in its parse
error), a wrong password, an unreachable host, passwords with an unencoded ``@``, ``:`` or ``/``
(libpq would read a piece of them as the host or port: refused before connecting, ``config show``
included), and wrong SASL credentials for the SASL_SSL Kafka.
Short commands run in-process (their logs captured); ``relay run`` and ``inbox run`` never end by
themselves, so they run as real processes until they have said what they wait for, or failed.
Every secret ends in ``LEAK7`` and is looked for case-insensitively, so a quoted fragment counts.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from click.testing import CliRunner

from outboxkit.cli import main
from outboxkit.devstack import KafkaServer
from tests.support.cli_commands import SHORT_COMMANDS

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
OUTBOXKIT = str(Path(sys.executable).parent / "outboxkit")
MARK = "leak7"
SAID = re.compile(r"waiting for|retrying|failed|error", re.IGNORECASE)  # it met the bad input
KAFKA_SECRET = "KafkaPw-LEAK7"
URL_CASES = {
    "bad_escape": "postgresql://{user}:Pct%zzPw-LEAK7@{host}/{db}",
    "wrong_password": "postgresql://{user}:WrongPw-LEAK7@{host}/{db}",
    "unreachable_host": "postgresql://{user}:UnreachPw-LEAK7@127.0.0.1:1/{db}",
    "two_at_signs": "postgresql://{user}:Pa:ss@w0rd-LEAK7@{host}/{db}",
    "at_then_port": "postgresql://{user}:p@ss:LEAK7w0rd99@{host}/{db}",
    "slash": "postgresql://{user}:LEAK7/ss@{host}/{db}",
}
REFUSED_CASES = {"two_at_signs", "at_then_port", "slash"}  # before any connection
LONG_COMMANDS = {
    "relay run": ["relay", "run"],
    "inbox run": ["inbox", "run", "--topic", "t"],
}
LONG_ENV = {
    "OUTBOXKIT_CONSUMER_NAME": "c",
    "OUTBOXKIT_CONSUMER_GROUP": "g",
    "OUTBOXKIT_CONSUMER_REGISTRY": "tests.integration.inbox_support:REGISTRY",
    "OUTBOXKIT_RELAY_KAFKA_TIMEOUT": "5",
    "OUTBOXKIT_RELAY_MODE": "exactly_once",
    "OUTBOXKIT_CONSUMER_DEAD_LETTER_CHECK": "off",  # straight to the database
}


def _bad_url(case: str, good: str) -> str:
    parts = urlsplit(good)
    return URL_CASES[case].format(
        user=parts.username, host=parts.netloc.rpartition("@")[2], db=parts.path.lstrip("/")
    )


def _assert_clean(output: str, *secrets: str) -> None:
    lowered = output.lower()
    assert MARK not in lowered, output
    for secret in secrets:
        assert secret.lower() not in lowered, output


def _run_short(
    args: list[str], env: dict[str, str], caplog: pytest.LogCaptureFixture, *, fails: bool = True
) -> str:
    """All a user would see (output, logs, a traceback if any); it must fail cleanly if told."""
    caplog.clear()
    result = CliRunner().invoke(main, ["-vv", *args], env=env)
    shown = result.output
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        shown += "".join(traceback.format_exception(result.exception))
    shown += caplog.text
    if fails:
        assert result.exit_code in (1, 2), shown  # the error path ran, in one line
        assert "Traceback" not in shown
    return shown


def _run_long(
    commands: dict[str, list[str]], env: dict[str, str], *, within: float = 30.0
) -> dict[str, str]:
    """All at once, each until it exits or logs a failure or what it waits for (then SIGTERM):
    what each printed."""
    full = {**os.environ, "PYTHONPATH": str(ROOT), **LONG_ENV, **env}
    procs = {
        name: subprocess.Popen(
            [OUTBOXKIT, "-v", *args],
            env=full,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=ROOT,
        )
        for name, args in commands.items()
    }
    lines: dict[str, list[str]] = {name: [] for name in procs}
    readers = [
        threading.Thread(target=lines[name].extend, args=(proc.stdout or (),), daemon=True)
        for name, proc in procs.items()
    ]
    for reader in readers:
        reader.start()
    deadline = time.monotonic() + within
    pending = set(procs)
    while pending and time.monotonic() < deadline:
        for name in list(pending):
            if procs[name].poll() is not None or any(SAID.search(x) for x in list(lines[name])):
                procs[name].terminate()
                pending.discard(name)
        time.sleep(0.05)
    for proc in procs.values():
        proc.terminate()
        proc.wait(timeout=30)
        if proc.stdout is not None:
            proc.stdout.close()
    for reader in readers:
        reader.join(timeout=30)
    return {name: "".join(found) for name, found in lines.items()}


@pytest.mark.parametrize("case", sorted(URL_CASES))
def test_bad_database_urls_leak_nothing(
    case: str,
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level("DEBUG")
    url = _bad_url(case, outboxkit_db_url)
    good_password = urlsplit(outboxkit_db_url).password or ""
    env = {"OUTBOXKIT_DATABASE_URL": url, "OUTBOXKIT_KAFKA_BOOTSTRAP": outboxkit_kafka_bootstrap}
    refused = case in REFUSED_CASES
    for args in SHORT_COMMANDS:
        shown = _run_short(args, env, caplog, fails=refused or args[0] != "config")
        _assert_clean(shown, good_password)
        if refused:
            assert "the database URL is invalid" in shown, shown
    # The URL as an option too (click echoes bad option values): where each group takes it.
    for args in (
        ["relay", "status", "--database-url", url],
        ["outbox", "--database-url", url, "parked"],
        ["inbox", "show", "--database-url", url],
        ["migrate", "up", "--database-url", url],
    ):
        _assert_clean(_run_short(args, {}, caplog))
    for name, output in _run_long(LONG_COMMANDS, env).items():
        _assert_clean(output, good_password)
        assert SAID.search(output), f"{name} did not meet the bad URL: {output}"


def test_bad_kafka_credentials_leak_nothing(
    outboxkit_db_url: str, outboxkit_secure_kafka: KafkaServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("DEBUG")
    listener = outboxkit_secure_kafka.sasl_ssl
    env = {
        **listener.env(),
        "OUTBOXKIT_KAFKA_SASL_PASSWORD": KAFKA_SECRET,
        "OUTBOXKIT_DATABASE_URL": outboxkit_db_url,
    }
    secrets = (KAFKA_SECRET, listener.password, urlsplit(outboxkit_db_url).password or "")
    for args in (["config", "show"], ["config", "show", "--json"]):
        _assert_clean(_run_short(args, env, caplog, fails=False), *secrets)
    for name, output in _run_long(LONG_COMMANDS, env).items():
        _assert_clean(output, *secrets)
        assert SAID.search(output), f"{name} did not meet the bad credentials: {output}"
