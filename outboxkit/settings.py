"""One settings model: defaults, a TOML file, ``OUTBOXKIT_*`` variables, secret files.

Each part reads its own variables (``OUTBOXKIT_DATABASE_URL``, ``OUTBOXKIT_KAFKA_*``, ...), so the
same Kafka settings reach every client the product creates. Secrets are ``SecretStr``: they never
show in a repr, a log line or an error message.
"""

from __future__ import annotations

import json
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, SecretStr, field_serializer, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from outboxkit.schema import DEFAULT_SCHEMA, validate_schema_name


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
    """The consumer process (``outboxkit inbox run``), ``OUTBOXKIT_CONSUMER_*``.

    ``registry`` and ``handler`` are ``module:attribute`` specs: the ``EventRegistry`` (with
    handlers registered by ``@registry.handler(...)``), and optionally one function for every
    event type without its own handler. ``topics`` is a comma-separated list or a JSON list.
    ``kafka_options`` are extra consumer properties in the client's own spelling.
    ``retention_window`` (seconds, 0 = off): finished inbox rows and rejections older than this
    are purged by the running consumer every ``retention_interval`` seconds.
    """

    model_config = SettingsConfigDict(env_prefix="OUTBOXKIT_CONSUMER_", extra="forbid")

    name: str | None = None
    group: str | None = None
    topics: Annotated[list[str], NoDecode] = Field(default_factory=list)
    registry: str | None = None
    handler: str | None = None
    schema_name: str = DEFAULT_SCHEMA
    max_attempts: int = Field(default=5, ge=1)
    retry_delay: float = Field(default=0.5, ge=0)
    lease_seconds: float = Field(default=30.0, gt=0)
    dead_letter: str | None = "{topic}.dlq"
    acks_topic: str | None = None
    offset_commit_interval: float = Field(default=0.0, ge=0)
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    dedup_window: float | None = Field(default=None, gt=0)
    dead_letter_check: Literal["fail", "warn", "off"] = "fail"
    retention_window: float = Field(default=7 * 24 * 3600.0, ge=0)
    retention_interval: float = Field(default=60.0, gt=0)
    max_unexpected_errors: int = Field(default=5, ge=1)
    error_detail: bool = False
    kafka_options: dict[str, str | int | float | bool] = Field(default_factory=dict)

    @field_validator("topics", mode="before")
    @classmethod
    def _split_topics(cls, value: object) -> object:
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                return json.loads(text)
            return [t.strip() for t in text.split(",") if t.strip()]
        return value

    @field_validator("schema_name")
    @classmethod
    def _valid_schema(cls, value: str) -> str:
        return validate_schema_name(value)

    def missing(self) -> list[str]:
        """The variables ``outboxkit inbox run`` needs that are not set."""
        needed = {"name": self.name, "group": self.group, "topics": self.topics}
        needed["registry"] = self.registry or self.handler
        return [f"OUTBOXKIT_CONSUMER_{k.upper()}" for k, v in needed.items() if not v]
