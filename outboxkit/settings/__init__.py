"""One settings model: defaults < TOML file < ``OUTBOXKIT_*`` variables < secret files < overrides.

Each part reads its own variables (``OUTBOXKIT_DATABASE_URL``, ``OUTBOXKIT_KAFKA_*``,
``OUTBOXKIT_RELAY_*``, ``OUTBOXKIT_CONSUMER_*``, ``OUTBOXKIT_SCHEMA``); ``load_settings`` builds
the whole :class:`Settings`. Secrets are ``SecretStr`` everywhere (the consumer's
``kafka_options`` values: ``Secret``, which keeps their type).
"""

from __future__ import annotations

from outboxkit.settings.kafka_only import load_kafka_settings
from outboxkit.settings.loading import (
    DatabaseOnlySettings,
    Settings,
    describe_errors,
    load_database_settings,
    load_settings,
)
from outboxkit.settings.models import (
    CONFIG_ENV,
    MAX_PRODUCERS_PER_SHARD,
    PREFIX,
    SCHEMA_ENV,
    SECRETS_DIR_ENV,
    ConsumerSettings,
    DatabaseSettings,
    KafkaClient,
    KafkaSettings,
    Mode,
    OnPublish,
    ParkedKeyPolicy,
    RelaySettings,
    SaslMechanism,
    SecurityProtocol,
)

__all__ = [
    "CONFIG_ENV",
    "MAX_PRODUCERS_PER_SHARD",
    "PREFIX",
    "SCHEMA_ENV",
    "SECRETS_DIR_ENV",
    "ConsumerSettings",
    "DatabaseOnlySettings",
    "DatabaseSettings",
    "KafkaClient",
    "KafkaSettings",
    "Mode",
    "OnPublish",
    "ParkedKeyPolicy",
    "RelaySettings",
    "SaslMechanism",
    "SecurityProtocol",
    "Settings",
    "describe_errors",
    "load_database_settings",
    "load_kafka_settings",
    "load_settings",
]
