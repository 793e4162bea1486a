"""The Kafka clients' own log lines carry no secret value of ours (``kafka.log_secrets``):
librdkafka quotes property values (an OIDC token endpoint with its credentials; ``debug=conf``),
aiokafka at DEBUG logs a SASL PLAIN login's bytes."""

from __future__ import annotations

import logging
import threading

import pytest
from confluent_kafka import Producer

from outboxkit.kafka.aiokafka_log import limit_aiokafka_log
from outboxkit.kafka.config import LIBRDKAFKA_LOGGER, aiokafka_options, confluent_config
from outboxkit.kafka.log_secrets import SecretMask
from outboxkit.settings import KafkaSettings

SECRETS = ("UrlSecret444", "UrlSecret555", "ExtSecret222", "OidcClientSecret111")
OIDC = {
    "sasl.mechanism": "OAUTHBEARER",
    "sasl.oauthbearer.method": "oidc",
    "sasl.oauthbearer.client.id": "billing",
    "sasl.oauthbearer.client.secret": "OidcClientSecret111",
    "sasl.oauthbearer.extensions": "token=ExtSecret222",
    "sasl.oauthbearer.token.endpoint.url": "https://idp:UrlSecret444@127.0.0.1:9/t?key=UrlSecret555",
}


class _Seen(logging.Handler):
    def __init__(self, wanted: str) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []
        self.wanted = wanted
        self.found = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())
        if self.wanted in self.lines[-1]:
            self.found.set()


def _aiokafka_client_with(password: str) -> logging.Logger:
    """An aiokafka client's options built with a SASL PLAIN ``password`` (its mask is
    process-wide from then on); the logger aiokafka logs its requests with."""
    settings = KafkaSettings(
        bootstrap="127.0.0.1:1",
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="PLAIN",
        sasl_username="alice",
        sasl_password=password,
    )
    logger = logging.getLogger("aiokafka.conn")  # as aiokafka's import makes it, before
    aiokafka_options(settings)  # the filter goes on the aiokafka loggers there are
    limit_aiokafka_log()
    return logger


@pytest.mark.parametrize("debug", [None, "conf"])
def test_librdkafka_lines_name_the_setting_instead_of_its_value(debug: str | None) -> None:
    """A real librdkafka client whose OIDC token endpoint cannot be reached: its ERROR line
    quotes the endpoint URL; with ``debug=conf`` it lists the properties' values."""
    properties = OIDC | ({"debug": debug} if debug else {})
    settings = KafkaSettings(
        bootstrap="127.0.0.1:1", security_protocol="SASL_PLAINTEXT", properties=properties
    )
    seen = _Seen("Failed to retrieve OIDC token")
    LIBRDKAFKA_LOGGER.addHandler(seen)
    level = LIBRDKAFKA_LOGGER.level
    LIBRDKAFKA_LOGGER.setLevel(logging.DEBUG)
    producer = Producer(confluent_config(settings))
    try:
        for _ in range(100):
            producer.poll(0.1)
            if seen.found.is_set():
                break
        assert seen.found.is_set(), seen.lines[-5:]
    finally:
        LIBRDKAFKA_LOGGER.removeHandler(seen)
        LIBRDKAFKA_LOGGER.setLevel(level)
    text = "\n".join(seen.lines)
    assert "<sasl.oauthbearer.token.endpoint.url>" in text
    if debug:
        assert "<sasl.oauthbearer.extensions>" in text
    for secret in SECRETS:
        assert secret not in text


def test_an_aiokafka_debug_line_shows_no_sasl_login(caplog: pytest.LogCaptureFixture) -> None:
    logger = _aiokafka_client_with("PlainKafkaSecret8812")
    with caplog.at_level(logging.DEBUG, logger="aiokafka"):
        logger.debug(
            "Request %d: %s", 3, "SaslAuthenticateRequest_v1(sasl_auth_bytes=b'\\x00\\xc3\\xa9x')"
        )
        logger.debug("logged in with %s", "PlainKafkaSecret8812")
        logger.error("failed: %s", "x PlainKafkaSecret8812 y")
    text = caplog.text
    assert "\\xc3" not in text
    assert "PlainKafkaSecret8812" not in text
    assert "sasl_auth_bytes=b'***'" in text
    assert "<OUTBOXKIT_KAFKA_SASL_PASSWORD>" in text


def test_only_secret_settings_are_masked_and_ordinary_lines_stay_readable() -> None:
    settings = KafkaSettings(
        bootstrap="127.0.0.1:1",
        properties={
            "debug": "broker,topic,metadata",
            "auto.offset.reset": "earliest",
            "sasl.oauthbearer.client.secret": "12345678",
        },
    )
    log = confluent_config(settings)["logger"]
    line = "1/1 brokers are down; Fetch from earliest offset; metadata; 12345678"
    assert log.mask.masked(line) == (
        "1/1 brokers are down; Fetch from earliest offset; metadata;"
        " <sasl.oauthbearer.client.secret>"
    )
    mask = SecretMask([("x.password", "abc"), ("y.password", "s3cret-v")])
    assert mask.masked("abc s3cret-v") == "abc <y.password>"  # shorter than MIN_MASKED: kept


def test_an_aiokafka_traceback_shows_no_secret(caplog: pytest.LogCaptureFixture) -> None:
    logger = _aiokafka_client_with("TracebackSecret4471")
    with caplog.at_level(logging.ERROR, logger="aiokafka"):
        try:
            raise RuntimeError("login TracebackSecret4471 refused")
        except RuntimeError:
            logger.exception("unexpected error")
    assert "TracebackSecret4471" not in caplog.text
    assert "login <OUTBOXKIT_KAFKA_SASL_PASSWORD> refused" in caplog.text
