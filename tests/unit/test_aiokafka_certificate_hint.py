"""An aiokafka client over TLS without a client certificate, refused by a broker that requires
one: under TLS 1.3 aiokafka logs a connection closed with the TLS alert as its cause, then raises
only "Unable to bootstrap". The decision (TLS, no certificate, a certificate alert) and how a
client's call sees the alert (aiokafka's log record, in the call's context) are tested here; the
real broker is met in tests/fault/test_secured_kafka_mtls.py."""

from __future__ import annotations

import asyncio
import logging
import ssl
from pathlib import Path

import pytest
from aiokafka.errors import KafkaConnectionError
from pydantic import SecretStr

from outboxkit.kafka.aiokafka_certificate import (
    CertificateWatch,
    _ConnectionErrors,
    certificate_alert,
    needs_certificate_hint,
)
from outboxkit.kafka.config import CLIENT_CERTIFICATE_HINT
from outboxkit.settings import KafkaSettings, SecurityProtocol

pytestmark = pytest.mark.unit

AIOKAFKA = logging.getLogger("aiokafka")
# What aiokafka's connection raises when the broker's alert ends it (seen from Kafka 4's SSL
# listener with ssl.client.auth=required, TLS 1.3), and what it logs it with.
BAD_CERTIFICATE = "[SSL: SSLV3_ALERT_BAD_CERTIFICATE] sslv3 alert bad certificate (_ssl.c:2580)"
REQUIRED = "[SSL: TLSV13_ALERT_CERTIFICATE_REQUIRED] tlsv13 alert certificate required (_ssl.c:1)"
HANDSHAKE = "[SSL: SSLV3_ALERT_HANDSHAKE_FAILURE] sslv3 alert handshake failure (_ssl.c:1)"
UNABLE = 'Unable connect to "%s:%s": %s'


def _closed(cause: BaseException | None) -> KafkaConnectionError:
    error = KafkaConnectionError("Connection at 127.0.0.1:9093 closed")
    error.__cause__ = cause
    return error


def _settings(protocol: SecurityProtocol, *, certificate: bool = False) -> KafkaSettings:
    sasl = protocol in (SecurityProtocol.SASL_SSL, SecurityProtocol.SASL_PLAINTEXT)
    settings = KafkaSettings(
        bootstrap="127.0.0.1:9093",
        security_protocol=protocol,
        sasl_mechanism="SCRAM-SHA-512" if sasl else None,
        sasl_username="u" if sasl else None,
        sasl_password=SecretStr("p") if sasl else None,
        ssl_ca_location=None,
        ssl_certificate_location=None,
        ssl_key_location=None,
        ssl_key_password=None,
        properties={},
    )
    if certificate:  # the files need not exist: nothing here opens them
        paths = {"ssl_certificate_location": Path("c.pem"), "ssl_key_location": Path("c.key")}
        settings = settings.model_copy(update=paths)
    return settings


SSL = _settings(SecurityProtocol.SSL)


@pytest.mark.parametrize(
    ("error", "alert"),
    [
        (_closed(ssl.SSLError(1, BAD_CERTIFICATE)), True),
        (_closed(ssl.SSLError(1, REQUIRED)), True),
        (ssl.SSLError(1, BAD_CERTIFICATE), True),  # TLS 1.2: the alert ends the handshake
        (_closed(None), False),  # closed without an alert: a listener expecting SASL, say
        (_closed(ConnectionResetError(104, "Connection reset by peer")), False),
        (ConnectionRefusedError(111, "Connect call failed"), False),  # the broker is away
        (ssl.SSLCertVerificationError(1, "certificate verify failed: bad certificate"), False),
        (ssl.SSLError(1, HANDSHAKE), False),  # no shared cipher or version, say
    ],
)
def test_only_a_certificate_alert_from_the_broker_counts(error: BaseException, alert: bool) -> None:
    assert certificate_alert(error) is alert


def test_a_cause_cycle_ends() -> None:
    first, second = _closed(None), _closed(None)
    first.__cause__, second.__cause__ = second, first
    assert certificate_alert(first) is False


@pytest.mark.parametrize(
    ("settings", "hinted"),
    [
        (SSL, True),
        (_settings(SecurityProtocol.SASL_SSL), True),
        (_settings(SecurityProtocol.SSL, certificate=True), False),  # set already
        (_settings(SecurityProtocol.SASL_SSL, certificate=True), False),
        (_settings(SecurityProtocol.PLAINTEXT), False),  # no TLS: no certificate is ever sent
        (_settings(SecurityProtocol.SASL_PLAINTEXT), False),
    ],
)
def test_the_hint_needs_tls_without_a_client_certificate(
    settings: KafkaSettings, hinted: bool
) -> None:
    alerted = [_closed(ssl.SSLError(1, BAD_CERTIFICATE))]
    assert needs_certificate_hint(settings, alerted) is hinted
    assert needs_certificate_hint(settings, [_closed(None)]) is False
    assert needs_certificate_hint(settings, []) is False


def test_a_call_sees_the_alert_aiokafka_logs_in_it() -> None:
    """The closed connection aiokafka logs while the call runs names the settings in the call's
    error, once; a line logged outside the call, or about another cause, does not."""
    error = _closed(ssl.SSLError(1, BAD_CERTIFICATE))
    AIOKAFKA.error(UNABLE, "127.0.0.1", 9093, error)  # no call watching: nothing noted
    with CertificateWatch(SSL) as quiet:
        AIOKAFKA.error(UNABLE, "127.0.0.1", 9093, ConnectionRefusedError(111, "refused"))
    assert quiet.explained("Unable to bootstrap") == "Unable to bootstrap"
    with CertificateWatch(SSL) as watch:
        AIOKAFKA.error(UNABLE, "127.0.0.1", 9093, error)
    text = watch.explained("cannot reach Kafka: Unable to bootstrap")
    assert text == f"cannot reach Kafka: Unable to bootstrap ({CLIENT_CERTIFICATE_HINT})"
    assert "OUTBOXKIT_KAFKA_SSL_CERTIFICATE_LOCATION" in text
    assert "OUTBOXKIT_KAFKA_SSL_KEY_LOCATION" in text
    assert watch.explained(text) == text  # never twice
    with CertificateWatch(_settings(SecurityProtocol.SSL, certificate=True)) as configured:
        AIOKAFKA.error(UNABLE, "127.0.0.1", 9093, error)
    assert configured.explained("x") == "x"


def test_a_task_the_call_starts_reports_to_its_watch() -> None:
    """aiokafka's bootstrap may run in a task of its own (``asyncio.wait_for`` on Python 3.11):
    it reports to the watch of the call that started it, and two calls at once keep theirs."""

    async def bootstrap(error: BaseException) -> None:
        await asyncio.sleep(0)
        AIOKAFKA.error(UNABLE, "127.0.0.1", 9093, error)

    async def call(error: BaseException) -> str:
        with CertificateWatch(SSL) as watch:
            await asyncio.wait_for(bootstrap(error), 5)
            return watch.explained("Unable to bootstrap")

    async def both() -> list[str]:
        alerted = _closed(ssl.SSLError(1, BAD_CERTIFICATE))
        return list(await asyncio.gather(call(alerted), call(_closed(None))))

    hinted, plain = asyncio.run(both())
    assert CLIENT_CERTIFICATE_HINT in hinted
    assert plain == "Unable to bootstrap"


class _Unprintable(ssl.SSLError):
    def __str__(self) -> str:
        raise RuntimeError("no text")


def test_an_error_that_cannot_be_read_does_not_stop_the_line() -> None:
    """The watch's filter runs inside aiokafka's logging call: it never raises."""
    error = _closed(None)
    error.__cause__ = ssl.SSLError(1, BAD_CERTIFICATE)
    error.__cause__.__cause__ = _Unprintable()
    watcher = _ConnectionErrors()

    def record(*args: object) -> logging.LogRecord:
        return AIOKAFKA.makeRecord(AIOKAFKA.name, logging.ERROR, __file__, 1, UNABLE, args, None)

    with CertificateWatch(SSL) as watch:
        assert watcher.filter(record("127.0.0.1", 9093, _Unprintable())) is True
        assert watcher.filter(record("127.0.0.1", 9093, error)) is True  # the alert comes first
    assert CLIENT_CERTIFICATE_HINT in watch.explained("x")
