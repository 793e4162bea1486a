"""The dev stack broker's ``reauth_ms`` option: asked for explicitly, on the SASL_SSL listener
only; without it the broker is configured (and logs) exactly as before."""

from __future__ import annotations

from pathlib import Path

import pytest

from outboxkit.devstack import KafkaServer
from outboxkit.devstack.kafka import _LOG4J2

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("security", "reauth_ms"), [("plaintext", 60_000), ("sasl_ssl", 0), ("sasl_ssl", -1)]
)
def test_reauth_needs_the_sasl_ssl_listener_and_a_positive_time(
    tmp_path: Path, security: str, reauth_ms: int
) -> None:
    with pytest.raises(ValueError, match="reauth_ms needs security='sasl_ssl'"):
        KafkaServer(tmp_path, security=security, reauth_ms=reauth_ms)  # type: ignore[arg-type]


def test_without_it_nothing_changes(tmp_path: Path) -> None:
    server = KafkaServer(tmp_path)
    assert server.reauth_ms is None
    config = server._write_config().read_text()
    assert "reauth" not in config
    assert (tmp_path / "log4j2.properties").read_text() == _LOG4J2
