"""Relay settings: defaults, then a TOML file, then ``OUTBOXKIT_*`` environment variables.

The database URL is a secret (it may carry a password): it is a ``SecretStr`` so it never shows
in a repr, a log line or an error message.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator
from pydantic import ValidationError as PydanticValidationError

from outboxkit.errors import ConfigurationError
from outboxkit.schema import DEFAULT_SCHEMA

ENV_PREFIX = "OUTBOXKIT_"


class Mode(StrEnum):
    EXACTLY_ONCE = "exactly_once"
    AT_LEAST_ONCE = "at_least_once"


class OnPublish(StrEnum):
    MARK = "mark"
    DELETE = "delete"


class ParkedKeyPolicy(StrEnum):
    WAIT = "wait"
    SKIP = "skip"


class ProducerBackend(StrEnum):
    CONFLUENT = "confluent"
    AIOKAFKA = "aiokafka"


class RelayConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    database_url: SecretStr
    kafka_bootstrap: str = ""  # required by `relay run`; the control commands do without
    schema_name: str = DEFAULT_SCHEMA
    relay_group: str = "default"
    owned_shards: tuple[int, ...] | None = None  # None: every shard of outbox_setting
    batch_size: int = Field(500, ge=1, le=10_000)
    poll_interval: float = Field(1.0, gt=0)  # the longest idle wait; pause/SIGTERM obey within it
    lease_ttl: float = Field(15.0, gt=0)
    mode: Mode = Mode.EXACTLY_ONCE
    on_publish: OnPublish = OnPublish.MARK
    parked_key_policy: ParkedKeyPolicy = ParkedKeyPolicy.WAIT
    producer: ProducerBackend = ProducerBackend.CONFLUENT
    checkpoint_topic: str = "outboxkit.relay.checkpoint"
    retention_seconds: float | None = 86_400.0  # None keeps published rows forever
    retention_batch: int = Field(1000, ge=1)
    metrics_port: int | None = None
    listen: bool = True
    backoff_initial: float = Field(0.2, gt=0)
    backoff_max: float = Field(5.0, gt=0)
    kafka_timeout: float = Field(30.0, gt=0)
    producer_options: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _check(self) -> RelayConfig:
        if self.owned_shards is not None and any(s < 0 for s in self.owned_shards):
            raise ValueError("owned_shards must be non-negative")
        return self

    @property
    def lease_renew_interval(self) -> float:
        return self.lease_ttl / 3

    def safe_summary(self) -> dict[str, Any]:
        """The settings as logged: everything but secrets."""
        return self.model_dump(exclude={"database_url", "producer_options"}, mode="json")


_ENV_FIELDS = {
    "DATABASE_URL": "database_url",
    "KAFKA_BOOTSTRAP": "kafka_bootstrap",
    "SCHEMA": "schema_name",
    "RELAY_GROUP": "relay_group",
    "RELAY_SHARDS": "owned_shards",
    "RELAY_BATCH_SIZE": "batch_size",
    "RELAY_POLL_INTERVAL": "poll_interval",
    "RELAY_LEASE_TTL": "lease_ttl",
    "RELAY_MODE": "mode",
    "RELAY_ON_PUBLISH": "on_publish",
    "RELAY_PARKED_KEY_POLICY": "parked_key_policy",
    "RELAY_PRODUCER": "producer",
    "RELAY_CHECKPOINT_TOPIC": "checkpoint_topic",
    "RELAY_RETENTION_SECONDS": "retention_seconds",
    "RELAY_METRICS_PORT": "metrics_port",
    "RELAY_LISTEN": "listen",
    "RELAY_KAFKA_TIMEOUT": "kafka_timeout",
    "RELAY_BACKOFF_MAX": "backoff_max",
}


def _from_env(env: Mapping[str, str]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for suffix, field in _ENV_FIELDS.items():
        raw = env.get(ENV_PREFIX + suffix)
        if raw is None or raw == "":
            continue
        if field == "owned_shards":
            values[field] = tuple(int(part) for part in raw.split(",") if part.strip())
        elif field == "retention_seconds" and raw.lower() in ("none", "forever"):
            values[field] = None
        else:
            values[field] = raw
    return values


def load_config(
    path: str | Path | None = None,
    *,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> RelayConfig:
    """Build the settings; later sources win: file, environment, explicit overrides."""
    values: dict[str, Any] = {}
    if path is not None:
        try:
            with open(path, "rb") as handle:
                document = tomllib.load(handle)
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigurationError(f"cannot read relay configuration {path}: {exc}") from exc
        values.update(document.get("relay", document))
    values.update(_from_env(os.environ if env is None else env))
    values.update({k: v for k, v in (overrides or {}).items() if v is not None})
    try:
        return RelayConfig(**values)
    except PydanticValidationError as exc:
        # errors() may echo input values; show only where and what, never the value itself.
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors()
        )
        raise ConfigurationError(f"invalid relay configuration: {problems}") from None
