"""How a client reaches the dev stack's SASL_SSL listener, and the ``OUTBOXKIT_KAFKA_*`` form of it.

The variable names are the ones outboxkit's settings read, so a test can hand a secured broker to
a relay or consumer process through its environment alone, exactly as an operator would.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import SecretStr

from outboxkit.errors import DevStackError
from outboxkit.settings import KafkaSettings, SaslMechanism, SecurityProtocol

BOOTSTRAP_ENV = "OUTBOXKIT_KAFKA_BOOTSTRAP"
SECURITY_PROTOCOL_ENV = "OUTBOXKIT_KAFKA_SECURITY_PROTOCOL"
SASL_MECHANISM_ENV = "OUTBOXKIT_KAFKA_SASL_MECHANISM"
SASL_USERNAME_ENV = "OUTBOXKIT_KAFKA_SASL_USERNAME"
SASL_PASSWORD_ENV = "OUTBOXKIT_KAFKA_SASL_PASSWORD"
SSL_CA_LOCATION_ENV = "OUTBOXKIT_KAFKA_SSL_CA_LOCATION"
PROPERTIES_ENV = "OUTBOXKIT_KAFKA_PROPERTIES"

SASL_SSL = "SASL_SSL"
SCRAM_SHA_512 = "SCRAM-SHA-512"
OAUTHBEARER = "OAUTHBEARER"


@dataclass(frozen=True)
class SaslSslListener:
    """Bootstrap, SCRAM credentials and CA file for a SASL_SSL listener.

    The password is left out of ``repr`` so printing the object (or a test failure showing it)
    does not reveal it.
    """

    bootstrap: str
    username: str
    password: str = field(repr=False)
    ca_location: str
    mechanism: str = SCRAM_SHA_512
    protocol: str = SASL_SSL

    def env(self) -> dict[str, str]:
        """The ``OUTBOXKIT_KAFKA_*`` variables that select this listener."""
        return {
            BOOTSTRAP_ENV: self.bootstrap,
            SECURITY_PROTOCOL_ENV: self.protocol,
            SASL_MECHANISM_ENV: self.mechanism,
            SASL_USERNAME_ENV: self.username,
            SASL_PASSWORD_ENV: self.password,
            SSL_CA_LOCATION_ENV: self.ca_location,
        }

    def kafka_settings(self) -> KafkaSettings:
        """The same, as outboxkit's Kafka settings (every field given: nothing from the env)."""
        return KafkaSettings(
            bootstrap=self.bootstrap,
            security_protocol=SecurityProtocol(self.protocol),
            sasl_mechanism=SaslMechanism(self.mechanism),
            sasl_username=self.username,
            sasl_password=SecretStr(self.password),
            ssl_ca_location=Path(self.ca_location),
        )

    def librdkafka_config(self) -> dict[str, str]:
        """The same, as librdkafka (confluent-kafka) properties."""
        return {
            "bootstrap.servers": self.bootstrap,
            "security.protocol": self.protocol,
            "sasl.mechanism": self.mechanism,
            "sasl.username": self.username,
            "sasl.password": self.password,
            "ssl.ca.location": self.ca_location,
        }

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> SaslSslListener:
        """Read an external SASL_SSL Kafka from the environment; names every missing variable."""
        required = (BOOTSTRAP_ENV, SASL_USERNAME_ENV, SASL_PASSWORD_ENV, SSL_CA_LOCATION_ENV)
        missing = [name for name in required if not environ.get(name)]
        protocol = environ.get(SECURITY_PROTOCOL_ENV, "")
        if protocol.upper() != SASL_SSL:
            missing.insert(0, f"{SECURITY_PROTOCOL_ENV}={SASL_SSL}")
        if missing:
            raise DevStackError(
                f"{BOOTSTRAP_ENV} names an external Kafka but a SASL_SSL one was asked for;"
                f" also set {', '.join(missing)}"
            )
        return cls(
            bootstrap=environ[BOOTSTRAP_ENV],
            username=environ[SASL_USERNAME_ENV],
            password=environ[SASL_PASSWORD_ENV],
            ca_location=environ[SSL_CA_LOCATION_ENV],
            mechanism=environ.get(SASL_MECHANISM_ENV) or SCRAM_SHA_512,
            protocol=SASL_SSL,
        )


@dataclass(frozen=True)
class OAuthBearerListener:
    """The same SASL_SSL listener reached with OAUTHBEARER and an unsecured JWT (``alg: none``,
    no signature: whoever connects names the principal). It has no typed settings, so the
    mechanism and librdkafka's token options are ``[kafka] properties``, as an operator gives
    them; only the confluent-kafka clients read those."""

    bootstrap: str
    principal: str
    ca_location: str
    protocol: str = SASL_SSL

    def properties(self) -> dict[str, str]:
        """The librdkafka properties that log in with librdkafka's own unsecured token."""
        return {
            "sasl.mechanism": OAUTHBEARER,
            "enable.sasl.oauthbearer.unsecure.jwt": "true",
            "sasl.oauthbearer.config": f"principal={self.principal}",
        }

    def env(self) -> dict[str, str]:
        """The ``OUTBOXKIT_KAFKA_*`` variables that select this listener (no SASL setting)."""
        return {
            BOOTSTRAP_ENV: self.bootstrap,
            SECURITY_PROTOCOL_ENV: self.protocol,
            SSL_CA_LOCATION_ENV: self.ca_location,
            PROPERTIES_ENV: json.dumps(self.properties()),
        }

    def kafka_settings(self) -> KafkaSettings:
        """The same, as outboxkit's Kafka settings (every field given: nothing from the env)."""
        return KafkaSettings(
            bootstrap=self.bootstrap,
            security_protocol=SecurityProtocol(self.protocol),
            sasl_mechanism=None,
            sasl_username=None,
            sasl_password=None,
            ssl_ca_location=Path(self.ca_location),
            properties={name: SecretStr(value) for name, value in self.properties().items()},
        )

    def librdkafka_config(self) -> dict[str, str]:
        """The same, as librdkafka (confluent-kafka) properties."""
        return {
            "bootstrap.servers": self.bootstrap,
            "security.protocol": self.protocol,
            "ssl.ca.location": self.ca_location,
            **self.properties(),
        }
