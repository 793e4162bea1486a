"""How a client reaches the dev stack's SSL listener that requires a client certificate (mutual
TLS), and the broker properties of that listener.

As for SASL_SSL (:mod:`outboxkit.devstack.sasl`), ``env()`` gives the ``OUTBOXKIT_KAFKA_*``
variables outboxkit's settings read, so a test configures a process exactly as an operator would.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from pydantic import SecretStr

from outboxkit.devstack.sasl import BOOTSTRAP_ENV, SECURITY_PROTOCOL_ENV, SSL_CA_LOCATION_ENV
from outboxkit.devstack.tls import BrokerTls
from outboxkit.settings import KafkaSettings, SecurityProtocol

SSL_CERTIFICATE_LOCATION_ENV = "OUTBOXKIT_KAFKA_SSL_CERTIFICATE_LOCATION"
SSL_KEY_LOCATION_ENV = "OUTBOXKIT_KAFKA_SSL_KEY_LOCATION"
SSL_KEY_PASSWORD_ENV = "OUTBOXKIT_KAFKA_SSL_KEY_PASSWORD"
SSL = "SSL"


def listener_tls_props(prefix: str, tls: BrokerTls, client_auth: str) -> dict[str, str]:
    """A TLS listener's keystore, truststore and ``ssl.client.auth`` (``none``/``required``)."""
    return {
        f"{prefix}ssl.client.auth": client_auth,
        f"{prefix}ssl.keystore.type": "PKCS12",
        f"{prefix}ssl.keystore.location": str(tls.keystore),
        f"{prefix}ssl.keystore.password": tls.password,
        f"{prefix}ssl.key.password": tls.password,
        f"{prefix}ssl.truststore.type": "PKCS12",
        f"{prefix}ssl.truststore.location": str(tls.truststore),
        f"{prefix}ssl.truststore.password": tls.password,
    }


@dataclass(frozen=True)
class MutualTlsListener:
    """Bootstrap, CA, client certificate and key (with its password if it is encrypted) for an
    SSL listener with ``ssl.client.auth=required``. The password is left out of ``repr``."""

    bootstrap: str
    ca_location: str
    certificate_location: str
    key_location: str
    key_password: str | None = field(default=None, repr=False)

    def env(self) -> dict[str, str]:
        """The ``OUTBOXKIT_KAFKA_*`` variables that select this listener."""
        env = {
            BOOTSTRAP_ENV: self.bootstrap,
            SECURITY_PROTOCOL_ENV: SSL,
            SSL_CA_LOCATION_ENV: self.ca_location,
            SSL_CERTIFICATE_LOCATION_ENV: self.certificate_location,
            SSL_KEY_LOCATION_ENV: self.key_location,
        }
        if self.key_password is not None:
            env[SSL_KEY_PASSWORD_ENV] = self.key_password
        return env

    def kafka_settings(self) -> KafkaSettings:
        """The same, as outboxkit's Kafka settings (every field given: nothing from the env)."""
        password = self.key_password
        return KafkaSettings(
            bootstrap=self.bootstrap,
            security_protocol=SecurityProtocol.SSL,
            sasl_mechanism=None,
            sasl_username=None,
            sasl_password=None,
            ssl_ca_location=Path(self.ca_location),
            ssl_certificate_location=Path(self.certificate_location),
            ssl_key_location=Path(self.key_location),
            ssl_key_password=SecretStr(password) if password is not None else None,
            properties={},
        )

    def librdkafka_config(self) -> dict[str, str]:
        """The same, as librdkafka (confluent-kafka) properties."""
        config = {
            "bootstrap.servers": self.bootstrap,
            "security.protocol": SSL,
            "ssl.ca.location": self.ca_location,
            "ssl.certificate.location": self.certificate_location,
            "ssl.key.location": self.key_location,
        }
        if self.key_password is not None:
            config["ssl.key.password"] = self.key_password
        return config
