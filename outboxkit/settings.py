"""One settings model: defaults, a TOML file, ``OUTBOXKIT_*`` variables, secret files.

Each part reads its own variables (``OUTBOXKIT_DATABASE_URL``, ``OUTBOXKIT_KAFKA_*``, ...), so the
same Kafka settings reach every client the product creates. Secrets are ``SecretStr``: they never
show in a repr, a log line or an error message.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path

from pydantic import Field, SecretStr, field_serializer
from pydantic_settings import BaseSettings, SettingsConfigDict


class SecurityProtocol(StrEnum):
    PLAINTEXT = "PLAINTEXT"
    SSL = "SSL"
    SASL_PLAINTEXT = "SASL_PLAINTEXT"
    SASL_SSL = "SASL_SSL"


class SaslMechanism(StrEnum):
    PLAIN = "PLAIN"
    SCRAM_SHA_256 = "SCRAM-SHA-256"
    SCRAM_SHA_512 = "SCRAM-SHA-512"


class KafkaClient(StrEnum):
    CONFLUENT = "confluent"
    AIOKAFKA = "aiokafka"


class DatabaseSettings(BaseSettings):
    """``OUTBOXKIT_DATABASE_URL``: a libpq URL; ``sslmode`` and friends pass through in it."""

    model_config = SettingsConfigDict(env_prefix="OUTBOXKIT_DATABASE_", extra="forbid")

    url: SecretStr | None = None


class KafkaSettings(BaseSettings):
    """Connection and security settings shared by every Kafka client (``OUTBOXKIT_KAFKA_*``).

    ``client`` picks the implementation (default: confluent-kafka when installed, else aiokafka).
    ``properties`` are extra librdkafka properties for the confluent-kafka client (their values
    are treated as secrets: a repr shows only their names).
    """

    model_config = SettingsConfigDict(env_prefix="OUTBOXKIT_KAFKA_", extra="forbid")

    bootstrap: str = ""
    client: KafkaClient | None = None
    client_id: str = "outboxkit"
    security_protocol: SecurityProtocol = SecurityProtocol.PLAINTEXT
    sasl_mechanism: SaslMechanism | None = None
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    ssl_ca_location: Path | None = None
    ssl_certificate_location: Path | None = None
    ssl_key_location: Path | None = None
    ssl_key_password: SecretStr | None = None
    ssl_check_hostname: bool = True
    properties: dict[str, SecretStr] = Field(default_factory=dict)

    @field_serializer("properties")
    def _names_only(self, value: dict[str, SecretStr]) -> dict[str, str]:
        return dict.fromkeys(value, "**********")

    @property
    def uses_sasl(self) -> bool:
        return self.security_protocol in (
            SecurityProtocol.SASL_SSL,
            SecurityProtocol.SASL_PLAINTEXT,
        )

    @property
    def uses_tls(self) -> bool:
        return self.security_protocol in (SecurityProtocol.SSL, SecurityProtocol.SASL_SSL)


class ConsumerSettings(BaseSettings):
    """The consumer process (``outboxkit inbox run``), ``OUTBOXKIT_CONSUMER_*``."""

    model_config = SettingsConfigDict(env_prefix="OUTBOXKIT_CONSUMER_", extra="forbid")
