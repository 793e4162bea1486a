"""One settings model: defaults < TOML file < ``OUTBOXKIT_*`` variables < secret files < overrides.

Each part reads its own variables (``OUTBOXKIT_DATABASE_URL``, ``OUTBOXKIT_KAFKA_*``,
``OUTBOXKIT_RELAY_*``, ...), so the same Kafka settings reach every client the product creates.
Secrets are ``SecretStr``: they never show in a repr, a log line or an error message, and errors
name the setting (its variable and its TOML key), never the value.
"""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Mapping
from contextvars import ContextVar
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, SecretStr, field_serializer, field_validator, model_validator
from pydantic import ValidationError as PydanticValidationError
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
)

from outboxkit.errors import ConfigurationError
from outboxkit.schema import DEFAULT_SCHEMA, validate_schema_name

PREFIX = "OUTBOXKIT_"
CONFIG_ENV = "OUTBOXKIT_CONFIG"
SECRETS_DIR_ENV = "OUTBOXKIT_SECRETS_DIR"
SCHEMA_ENV = "OUTBOXKIT_SCHEMA"


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


class Mode(StrEnum):
    EXACTLY_ONCE = "exactly_once"
    AT_LEAST_ONCE = "at_least_once"


class OnPublish(StrEnum):
    MARK = "mark"
    DELETE = "delete"


class ParkedKeyPolicy(StrEnum):
    WAIT = "wait"
    SKIP = "skip"


def _text(value: Any) -> str:
    """A TOML value as librdkafka wants it (``true``, not ``True``)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


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
    properties: Annotated[dict[str, SecretStr], NoDecode] = Field(default_factory=dict)

    @field_validator("properties", mode="before")
    @classmethod
    def _json_object(cls, value: Any) -> Any:
        if isinstance(value, str):  # from a variable: a JSON object of strings
            try:
                value = json.loads(value)
            except ValueError:
                raise ValueError("must be a JSON object of strings") from None
        if isinstance(value, Mapping):
            return {
                str(name): item if isinstance(item, SecretStr) else _text(item)
                for name, item in value.items()
            }
        return value

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


class RelaySettings(BaseSettings):
    """The relay process (``outboxkit relay run``), ``OUTBOXKIT_RELAY_*``."""

    model_config = SettingsConfigDict(env_prefix="OUTBOXKIT_RELAY_", extra="forbid")

    group: str = Field("default", min_length=1)
    # None: every shard of outbox_setting.shard_count. In a variable: "0,2".
    shards: Annotated[tuple[int, ...] | None, NoDecode] = None
    batch_size: int = Field(500, ge=1, le=10_000)
    poll_interval: float = Field(1.0, gt=0)  # the longest idle wait; pause/SIGTERM obey within it
    lease_ttl: float = Field(15.0, gt=0)
    mode: Mode = Mode.EXACTLY_ONCE
    on_publish: OnPublish = OnPublish.MARK
    parked_key_policy: ParkedKeyPolicy = ParkedKeyPolicy.WAIT
    checkpoint_topic: str = Field("outboxkit.relay.checkpoint", min_length=1)
    retention_seconds: float | None = Field(86_400.0, ge=0)  # None ("forever") keeps rows
    retention_batch: int = Field(1000, ge=1)
    metrics_port: int | None = Field(None, ge=0, le=65_535)
    metrics_host: str = "127.0.0.1"  # the manifests set 0.0.0.0 inside a pod
    listen: bool = True
    backoff_initial: float = Field(0.2, gt=0)
    backoff_max: float = Field(5.0, gt=0)
    kafka_timeout: float = Field(30.0, gt=0)

    @field_validator("shards", mode="before")
    @classmethod
    def _comma_list(cls, value: Any) -> Any:
        if isinstance(value, str):
            parts = [part.strip() for part in value.split(",")]
            return tuple(int(part) for part in parts if part) or None
        return value

    @field_validator("shards")
    @classmethod
    def _non_negative(cls, value: tuple[int, ...] | None) -> tuple[int, ...] | None:
        if value is not None and any(shard < 0 for shard in value):
            raise ValueError("shard numbers must be non-negative")
        return value

    @field_validator("retention_seconds", "metrics_port", mode="before")
    @classmethod
    def _off(cls, value: Any) -> Any:
        if isinstance(value, str) and value.strip().lower() in ("none", "forever", "off", ""):
            return None
        return value

    @model_validator(mode="after")
    def _backoff_order(self) -> RelaySettings:
        if self.backoff_initial > self.backoff_max:
            raise ValueError("backoff_initial must not exceed backoff_max")
        return self

    @property
    def lease_renew_interval(self) -> float:
        return self.lease_ttl / 3


class ConsumerSettings(BaseSettings):
    """The consumer process (``outboxkit inbox run``), ``OUTBOXKIT_CONSUMER_*``.

    ``registry`` and ``handler`` are ``module:attribute`` specs: the ``EventRegistry`` (with
    handlers registered by ``@registry.handler(...)``), and optionally one function for every
    event type without its own handler. ``topics`` is a comma-separated list or a JSON list.
    ``kafka_options`` are extra consumer properties in the client's own spelling.
    """

    model_config = SettingsConfigDict(env_prefix="OUTBOXKIT_CONSUMER_", extra="forbid")

    name: str | None = None
    group: str | None = None
    topics: Annotated[list[str], NoDecode] = Field(default_factory=list)
    registry: str | None = None
    handler: str | None = None
    max_attempts: int = Field(default=5, ge=1)
    retry_delay: float = Field(default=0.5, ge=0)
    lease_seconds: float = Field(default=30.0, gt=0)
    dead_letter: str | None = "{topic}.dlq"
    acks_topic: str | None = None
    offset_commit_interval: float = Field(default=0.0, ge=0)
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    dedup_window: float | None = Field(default=None, gt=0)
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

    def missing(self) -> list[str]:
        """The variables ``outboxkit inbox run`` needs that are not set."""
        needed = {"name": self.name, "group": self.group, "topics": self.topics}
        needed["registry"] = self.registry or self.handler
        return [f"OUTBOXKIT_CONSUMER_{k.upper()}" for k, v in needed.items() if not v]


# --------------------------------------------------------------------------- the whole model

_TOML_FILE: ContextVar[Path | None] = ContextVar("outboxkit_toml_file", default=None)
_SECRETS_DIR: ContextVar[Path | None] = ContextVar("outboxkit_secrets_dir", default=None)


def _schema_alias(values: Mapping[str, Any]) -> dict[str, Any]:
    """``OUTBOXKIT_SCHEMA`` / TOML ``schema`` -> the ``schema_name`` field (``schema`` is taken
    by pydantic's BaseModel)."""
    out = dict(values)
    for short in ("outboxkit_schema", "schema"):
        if short in out:
            out.setdefault(short + "_name", out.pop(short))
    return out


class _EnvSource(EnvSettingsSource):
    """``OUTBOXKIT_*`` variables, with ``OUTBOXKIT_SCHEMA`` as the schema's name."""

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return _schema_alias(super()._load_env_vars())


class _SecretFilesSource(EnvSettingsSource):
    """Files named like the variables (``OUTBOXKIT_DATABASE_URL``, ...) in
    ``OUTBOXKIT_SECRETS_DIR`` (a mounted Kubernetes secret, say). They win over variables."""

    def _load_env_vars(self) -> Mapping[str, str | None]:
        directory = _SECRETS_DIR.get()
        if directory is None:
            return {}
        found: dict[str, str | None] = {}
        for path in sorted(directory.iterdir()):
            if path.name.upper().startswith(PREFIX) and path.is_file():
                found[path.name.lower()] = path.read_text().rstrip("\r\n")
        return _schema_alias(found)


class _TomlSource(PydanticBaseSettingsSource):
    """The TOML file: ``[database]``, ``[kafka]``, ``[relay]``, ``[consumer]``, ``schema``."""

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        raise NotImplementedError  # __call__ reads the whole document at once

    def __call__(self) -> dict[str, Any]:
        path = _TOML_FILE.get()
        if path is None:
            return {}
        try:
            with open(path, "rb") as handle:
                document = tomllib.load(handle)
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigurationError(f"cannot read configuration file {path}: {exc}") from None
        return _schema_alias(document)


class Settings(BaseSettings):
    """Everything outboxkit's processes read; build it with :func:`load_settings`."""

    model_config = SettingsConfigDict(
        env_prefix=PREFIX,
        env_nested_delimiter="_",
        env_nested_max_split=1,  # OUTBOXKIT_KAFKA_SASL_PASSWORD -> kafka.sasl_password
        extra="forbid",
    )

    database: DatabaseSettings = Field(default_factory=DatabaseSettings)
    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    relay: RelaySettings = Field(default_factory=RelaySettings)
    consumer: ConsumerSettings = Field(default_factory=ConsumerSettings)
    schema_name: str = DEFAULT_SCHEMA

    @model_validator(mode="before")
    @classmethod
    def _aliases(cls, values: Any) -> Any:
        return _schema_alias(values) if isinstance(values, Mapping) else values

    @field_validator("schema_name")
    @classmethod
    def _valid_schema(cls, value: str) -> str:
        try:
            return validate_schema_name(value)
        except Exception:
            raise ValueError("use lower-case letters, digits and _ (at most 63)") from None

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Highest first: overrides, secret files, variables, the TOML file (defaults last).
        return (
            init_settings,
            _SecretFilesSource(settings_cls),
            _EnvSource(settings_cls),
            _TomlSource(settings_cls),
        )

    @property
    def database_url(self) -> SecretStr:
        """The URL, or a :class:`ConfigurationError` naming the setting."""
        if self.database.url is None or not self.database.url.get_secret_value():
            raise ConfigurationError(
                "the database URL is not set (OUTBOXKIT_DATABASE_URL, [database] url"
                " or --database-url)"
            )
        return self.database.url

    def redacted(self) -> dict[str, Any]:
        """The effective settings as shown to people: secrets masked, the URL's password too."""
        from outboxkit.db.connect import redact

        shown = self.model_dump(mode="json")
        shown["schema"] = shown.pop("schema_name")
        url = self.database.url
        if url is not None:
            shown["database"]["url"] = redact(url.get_secret_value(), url)
        return shown


def _drop_none(values: Mapping[str, Any]) -> dict[str, Any]:
    """Overrides without the options nobody gave (``None``), at any depth."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, Mapping):
            nested = _drop_none(value)
            if nested:
                out[key] = nested
        elif value is not None:
            out[key] = value
    return out


def _setting_name(loc: tuple[int | str, ...]) -> str:
    """``("relay", "batch_size")`` -> ``OUTBOXKIT_RELAY_BATCH_SIZE ([relay] batch_size)``."""
    parts = [str(part) for part in loc]
    if parts and parts[0] == "schema_name":
        return f"{SCHEMA_ENV} (schema)"
    if len(parts) >= 2 and parts[0] in Settings.model_fields:
        variable = PREFIX + "_".join(parts[:2]).upper()
        return f"{variable} ([{parts[0]}] {'.'.join(parts[1:])})"
    return ".".join(parts) or "settings"


def describe_errors(exc: PydanticValidationError) -> str:
    """Where and what, never the value (pydantic's own text may echo the input)."""
    return "; ".join(f"{_setting_name(err['loc'])}: {err['msg']}" for err in exc.errors())


def _secrets_dir() -> Path | None:
    raw = os.environ.get(SECRETS_DIR_ENV)
    if not raw:
        return None
    directory = Path(raw)
    if not directory.is_dir():
        raise ConfigurationError(f"{SECRETS_DIR_ENV} is not a readable directory")
    return directory


def load_settings(
    path: str | Path | None = None, *, overrides: Mapping[str, Any] | None = None
) -> Settings:
    """Build the settings; later sources win: defaults, the TOML file (``path`` or
    ``OUTBOXKIT_CONFIG``), ``OUTBOXKIT_*`` variables, secret files in ``OUTBOXKIT_SECRETS_DIR``,
    then ``overrides`` (nested by section; ``None`` values are ignored, as for CLI options not
    given). Raises :class:`ConfigurationError` naming each invalid setting."""
    toml = path if path is not None else os.environ.get(CONFIG_ENV) or None
    tokens = (
        _TOML_FILE.set(Path(toml) if toml is not None else None),
        _SECRETS_DIR.set(_secrets_dir()),
    )
    try:
        return Settings(**_drop_none(overrides or {}))
    except PydanticValidationError as exc:
        raise ConfigurationError(f"invalid settings: {describe_errors(exc)}") from None
    except SettingsError as exc:
        # e.g. a variable that should hold JSON does not; the message names the field only.
        raise ConfigurationError(f"invalid settings: {exc}") from None
    finally:
        _SECRETS_DIR.reset(tokens[1])
        _TOML_FILE.reset(tokens[0])
