"""The Kafka settings alone, from every source the processes read (:func:`load_kafka_settings`).

What a consumer built in code reads when it is given no settings: ``KafkaSettings()`` reads the
``OUTBOXKIT_KAFKA_*`` variables only, so TLS or SASL kept in the secrets directory or the TOML
file would be dropped without a word, and the client would connect in plaintext. The relay's
and the consumer's own sections, the database's and the schema are not read: a setting the
caller does not use (an embedded consumer gets its engine from the application) cannot stop it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import Field

from outboxkit.settings.loading import SourcedSettings, _load
from outboxkit.settings.models import KafkaSettings


class KafkaOnlySettings(SourcedSettings):
    """``[kafka]`` alone; other sections and the schema are not looked at."""

    kafka: KafkaSettings = Field(default_factory=KafkaSettings)


def load_kafka_settings(
    path: str | Path | None = None, *, overrides: Mapping[str, Any] | None = None
) -> KafkaSettings:
    """The ``[kafka]`` section as :func:`~outboxkit.settings.load_settings` builds it: the TOML
    file (``path`` or ``OUTBOXKIT_CONFIG``), ``OUTBOXKIT_KAFKA_*`` variables, then secret files
    in ``OUTBOXKIT_SECRETS_DIR``, then ``overrides`` (``{"kafka": {...}}``, ``None`` values
    ignored). Raises :class:`~outboxkit.errors.ConfigurationError`."""
    return _load(KafkaOnlySettings, path, overrides).kafka
