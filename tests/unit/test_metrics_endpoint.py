"""A metrics address the process cannot bind ends in one line naming the settings."""

from __future__ import annotations

import os
import socket

import pytest
from click.testing import CliRunner

from outboxkit.cli import main

pytest.importorskip("prometheus_client")

SECRET = "pw-LEAK7"
URL = f"postgresql://app:{SECRET}@127.0.0.1:1/app?connect_timeout=2"  # nothing listens on 1


def test_a_metrics_port_in_use_is_one_line_naming_the_setting() -> None:
    env: dict[str, str | None] = {k: None for k in os.environ if k.startswith("OUTBOXKIT_")}
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = CliRunner(env=env).invoke(
            main,
            [
                "relay",
                "run",
                "--database-url",
                URL,
                "--kafka-bootstrap",
                "127.0.0.1:1",
                "--metrics-port",
                str(port),
            ],
        )
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code == 1, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    assert f"'127.0.0.1' port {port}" in lines[0]
    assert "metrics_port" in lines[0]
    assert "OUTBOXKIT_RELAY_METRICS_PORT" in lines[0]
    assert SECRET not in result.output


def test_the_consumer_metrics_port_in_use_is_a_configuration_error_naming_it() -> None:
    """`inbox run` starts its metrics endpoint the same way (before any Kafka or database)."""
    from outboxkit.errors import ConfigurationError
    from outboxkit.inbox import worker
    from outboxkit.settings import ConsumerSettings

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigurationError) as caught:
            worker._metrics(ConsumerSettings(name="c", metrics_port=port))
    text = str(caught.value)
    assert f"'127.0.0.1' port {port}" in text
    assert "OUTBOXKIT_CONSUMER_METRICS_PORT" in text
    assert "\n" not in text


def test_the_consumer_metrics_endpoint_answers_its_metrics() -> None:
    import urllib.request

    from outboxkit.inbox import worker
    from outboxkit.settings import ConsumerSettings

    with socket.socket() as probe:  # a free port (the endpoint's thread outlives the test)
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    metrics = worker._metrics(ConsumerSettings(name="c", metrics_port=port))
    assert metrics is not None
    for path in ("/metrics", "/"):
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as answer:
            assert answer.status == 200
            assert b"outboxkit_inbox_" in answer.read()
