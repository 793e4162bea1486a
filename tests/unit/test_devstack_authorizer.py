"""The dev stack broker's ``authorizer`` option: only with the SASL_SSL listener, whose SCRAM
user then needs ACLs; without it the broker has no authorizer, as before."""

from __future__ import annotations

from pathlib import Path

import pytest

from outboxkit.devstack import KafkaServer

pytestmark = pytest.mark.unit


def test_the_authorizer_needs_the_sasl_ssl_listener(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="authorizer=True needs security='sasl_ssl'"):
        KafkaServer(tmp_path, authorizer=True)


def test_without_it_no_authorizer_is_configured(tmp_path: Path) -> None:
    config = KafkaServer(tmp_path)._write_config().read_text()
    keys = {line.split("=", 1)[0] for line in config.splitlines()}
    assert "authorizer.class.name" not in keys
    assert "super.users" not in keys
