"""The dev stack broker's ``security="ssl"`` option (an SSL listener requiring client
certificates): its validation, and that the default broker is configured as before."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from outboxkit.devstack import KafkaServer, MutualTlsListener
from outboxkit.errors import DevStackError
from outboxkit.settings import SecurityProtocol

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"security": "mtls"}, "security must be 'plaintext', 'sasl_ssl' or 'ssl'"),
        ({"security": "ssl", "authorizer": True}, "authorizer=True needs security='sasl_ssl'"),
        ({"security": "ssl", "oauthbearer": True}, "oauthbearer=True needs security='sasl_ssl'"),
        ({"security": "ssl", "reauth_ms": 1000}, "reauth_ms needs security='sasl_ssl'"),
    ],
)
def test_options_that_do_not_fit_are_refused(
    tmp_path: Path, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        KafkaServer(tmp_path, **options)


@pytest.mark.parametrize("security", ["plaintext", "sasl_ssl"])
def test_only_the_ssl_broker_has_the_client_certificate_listener(
    tmp_path: Path, security: Any
) -> None:
    server = KafkaServer(tmp_path, security=security)
    with pytest.raises(DevStackError, match="without security='ssl'"):
        server.mtls()
    if security == "plaintext":  # the default broker's configuration is as before
        config = server._write_config().read_text()
        assert "SSL" not in config
        assert "ssl.client.auth" not in config


def test_the_listener_gives_the_key_password_only_with_the_encrypted_key(tmp_path: Path) -> None:
    server = KafkaServer(tmp_path, security="ssl")
    assert server.bootstrap != server.plaintext_bootstrap
    plain, encrypted = server.mtls(), server.mtls(encrypted_key=True)
    assert plain.key_password is None
    assert "OUTBOXKIT_KAFKA_SSL_KEY_PASSWORD" not in plain.env()
    assert encrypted.key_password
    assert encrypted.env()["OUTBOXKIT_KAFKA_SSL_KEY_PASSWORD"] == encrypted.key_password
    assert encrypted.key_password not in repr(encrypted)
    assert encrypted.key_location != plain.key_location
    settings = encrypted.kafka_settings()
    assert settings.security_protocol is SecurityProtocol.SSL
    assert str(settings.ssl_certificate_location) == encrypted.certificate_location
    assert isinstance(plain, MutualTlsListener)
