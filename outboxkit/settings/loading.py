"""The whole settings model and how it is loaded: defaults < TOML file < ``OUTBOXKIT_*``
variables < secret files < overrides. Errors name the setting (its variable and its TOML key),
never the value.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from contextvars import ContextVar
from pathlib import Path
from typing import Any, TypeVar

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic import ValidationError as PydanticValidationError
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
)

from outboxkit.errors import ConfigurationError
from outboxkit.schema import DEFAULT_SCHEMA, validate_schema_name
from outboxkit.settings.models import (
    CONFIG_ENV,
    PREFIX,
    SCHEMA_ENV,
    SECRETS_DIR_ENV,
    ConsumerSettings,
    DatabaseSettings,
    KafkaSettings,
    RelaySettings,
)

_Model = TypeVar("_Model", bound="SourcedSettings")
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
        # A model that ignores other sections (DatabaseOnlySettings, KafkaOnlySettings) does not
        # read their files: an unreadable Kafka secret must not stop a migrate job.
        partial = self.settings_cls.model_config.get("extra") == "ignore"
        wanted = tuple(PREFIX + name.upper() for name in self.settings_cls.model_fields)
        schema = "schema_name" in self.settings_cls.model_fields
        found: dict[str, str | None] = {}
        for path in _listing(directory):
            name = path.name.upper()
            if partial and not (name.startswith(wanted) or (schema and name == SCHEMA_ENV)):
                continue
            if name.startswith(PREFIX) and _is_file(path):
                found[path.name.lower()] = _secret_text(path)
        return _schema_alias(found)


def _listing(directory: Path) -> list[Path]:
    """The secrets directory's entries, or a :class:`ConfigurationError` naming it (not a
    traceback: one owned by another user cannot be listed)."""
    try:
        return sorted(directory.iterdir())
    except OSError as exc:
        problem = exc.strerror or type(exc).__name__
    raise ConfigurationError(f"cannot read {SECRETS_DIR_ENV} {directory}: {problem}")


def _is_file(path: Path) -> bool:
    """Whether an entry is a file, or a :class:`ConfigurationError` naming it when that cannot
    be told (a directory that can be listed but not searched)."""
    try:
        return path.is_file()
    except OSError as exc:
        problem = exc.strerror or type(exc).__name__
    raise ConfigurationError(f"cannot read secret file {path}: {problem}")


def _secret_text(path: Path) -> str:
    """A secret file's text (UTF-8, whatever the locale), or a :class:`ConfigurationError`
    naming the file: a decoding error would quote its bytes."""
    try:
        return path.read_text(encoding="utf-8").rstrip("\r\n")
    except UnicodeDecodeError:
        problem = "it is not valid UTF-8"
    except OSError as exc:
        problem = exc.strerror or type(exc).__name__
    raise ConfigurationError(f"cannot read secret file {path}: {problem}")


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
        except UnicodeDecodeError:  # its text quotes the bytes
            raise ConfigurationError(
                f"cannot read configuration file {path}: it is not valid UTF-8"
            ) from None
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigurationError(f"cannot read configuration file {path}: {exc}") from None
        return _schema_alias(document)


class SourcedSettings(BaseSettings):
    """The sections a subclass declares, from the TOML file, ``OUTBOXKIT_*`` variables and
    secret files; the others are not looked at (``extra="ignore"``, :class:`_SecretFilesSource`)."""

    model_config = SettingsConfigDict(
        env_prefix=PREFIX,
        env_nested_delimiter="_",
        env_nested_max_split=1,  # OUTBOXKIT_KAFKA_SASL_PASSWORD -> kafka.sasl_password
        extra="ignore",
        hide_input_in_errors=True,
    )

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


class DatabaseOnlySettings(SourcedSettings):
    """The database and schema alone, from the same sources (:func:`load_database_settings`):
    what the operator commands (``migrate``, ``outbox``, ``inbox show``...) read, so a relay or
    consumer setting they never use cannot stop them. Other sections are not even looked at."""

    database: DatabaseSettings = Field(default_factory=DatabaseSettings)
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

    @property
    def database_url(self) -> SecretStr:
        """The URL, or a :class:`ConfigurationError`: not set, or parts that could be read
        differently (:func:`outboxkit.db.checked_url`)."""
        from outboxkit.db.connect import checked_url

        if self.database.url is None or not self.database.url.get_secret_value():
            raise ConfigurationError(
                "the database URL is not set (OUTBOXKIT_DATABASE_URL, [database] url"
                " or --database-url)"
            )
        checked_url(self.database.url)
        return self.database.url


class Settings(DatabaseOnlySettings):
    """Everything outboxkit's processes read; build it with :func:`load_settings`."""

    model_config = SettingsConfigDict(extra="forbid")

    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    relay: RelaySettings = Field(default_factory=RelaySettings)
    consumer: ConsumerSettings = Field(default_factory=ConsumerSettings)

    def redacted(self) -> dict[str, Any]:
        """The effective settings as shown to people: secrets masked, the URL's password too.
        A URL whose password could not be told apart (:func:`outboxkit.db.checked_url`) is a
        :class:`ConfigurationError` here as everywhere, not shown half-masked."""
        from outboxkit.db.connect import checked_url, redact

        shown = self.model_dump(mode="json")
        shown["schema"] = shown.pop("schema_name")
        url = self.database.url
        if url is not None:
            shown["database"]["url"] = redact(checked_url(url), url)
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
    return _load(Settings, path, overrides)


def load_database_settings(
    path: str | Path | None = None, *, overrides: Mapping[str, Any] | None = None
) -> DatabaseOnlySettings:
    """:func:`load_settings` of the database and schema alone (the other sections unread)."""
    return _load(DatabaseOnlySettings, path, overrides)


def _load(
    model: type[_Model], path: str | Path | None, overrides: Mapping[str, Any] | None
) -> _Model:
    toml = path if path is not None else os.environ.get(CONFIG_ENV) or None
    tokens = (
        _TOML_FILE.set(Path(toml) if toml is not None else None),
        _SECRETS_DIR.set(_secrets_dir()),
    )
    try:
        return model(**_drop_none(overrides or {}))
    except PydanticValidationError as exc:
        raise ConfigurationError(f"invalid settings: {describe_errors(exc)}") from None
    except SettingsError as exc:
        # e.g. a variable that should hold JSON does not; the message names the field only.
        raise ConfigurationError(f"invalid settings: {exc}") from None
    finally:
        _SECRETS_DIR.reset(tokens[1])
        _TOML_FILE.reset(tokens[0])
