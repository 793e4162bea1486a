"""A service that never becomes ready says why: the readiness probe's last failure, with the
stack's secrets masked, not only a log tail that may well say "ready"."""

from __future__ import annotations

import sys
from pathlib import Path

import psycopg
import pytest

from outboxkit.devstack.process import ServiceProcess
from outboxkit.errors import DevStackError

pytestmark = pytest.mark.unit

SECRET = "s3cret-Pw_of-the-stack"


def test_the_timeout_names_the_last_probe_failure_without_the_password(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OUTBOXKIT_CACHE_DIR", str(tmp_path / "cache"))
    log = tmp_path / "service.log"
    log.write_text("LOG:  database system is ready to accept connections\n")

    def probe() -> bool:
        raise psycopg.OperationalError(
            f"connection to postgresql://u:{SECRET}@127.0.0.1:1/db failed:"
            " server does not support SSL, but SSL was required"
        )

    service = ServiceProcess(
        "postgresql",
        [sys.executable, "-c", "import time; time.sleep(60)"],
        log,
        probe,
        start_timeout=0.5,
        secrets=(SECRET,),
    )
    with pytest.raises(DevStackError) as caught:
        service.start()
    assert not service.is_running()
    message = str(caught.value)
    assert "last probe: OperationalError: connection to postgresql://u:***@" in message
    assert "SSL was required" in message
    assert SECRET not in message
    assert "ready to accept connections" in message  # the log tail too
