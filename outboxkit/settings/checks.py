"""Checks of single settings, kept apart from the models so each model stays readable.

Every problem is told without the value: a setting may be a secret, and the message names it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from string import Formatter
from typing import TYPE_CHECKING, Any

from pydantic import AfterValidator, SecretStr

from outboxkit.errors import InvalidTopicError
from outboxkit.events import MAX_TOPIC_LENGTH, validate_topic
from outboxkit.schema import name_problem

if TYPE_CHECKING:
    from outboxkit.settings.models import KafkaSettings

#: The settings each security protocol family uses (refused where it uses none).
SASL_SETTINGS = ("sasl_mechanism", "sasl_username", "sasl_password")
_PROTOCOL = "OUTBOXKIT_KAFKA_SECURITY_PROTOCOL ([kafka] security_protocol)"
SSL_SETTINGS = (
    "ssl_ca_location",
    "ssl_certificate_location",
    "ssl_key_location",
    "ssl_key_password",
)


def librdkafka_text(value: Any) -> str:
    """A TOML or JSON value as librdkafka wants it (``true``, not ``True``)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def property_values(value: Any) -> Any:
    """``[kafka] properties`` as text, refusing what has no librdkafka spelling: a null would
    become ``"None"`` and a table its Python repr, both handed to the client as if meant."""
    if not isinstance(value, Mapping):
        return value
    out: dict[str, Any] = {}
    for name, item in value.items():
        if not isinstance(item, SecretStr | str | int | float | bool):
            raise ValueError(f"{str(name)!r}: values must be strings, numbers or booleans")
        out[str(name)] = item if isinstance(item, SecretStr) else librdkafka_text(item)
    return out


def non_empty_path(value: Any) -> Any:
    """An empty path is refused: ``Path("")`` is the working directory, not "unset"."""
    if isinstance(value, str | Path) and not str(value).strip():
        raise ValueError("must not be empty (leave the setting out to unset it)")
    return value


def not_empty(value: Any) -> Any:
    """An empty user name or password is a mistake (a variable set to nothing), not a login."""
    text = value.get_secret_value() if isinstance(value, SecretStr) else value
    if text is not None and not text:
        raise ValueError("must not be empty (leave the setting out to unset it)")
    return value


def topic_name(value: str) -> str:
    """A name Kafka accepts as a topic (the writer's check): a broker refuses any other for
    ever, and a relay would wait on it without end."""
    try:
        return validate_topic(value)
    except InvalidTopicError:  # its message quotes the name
        raise ValueError(
            f"is not a Kafka topic name (1 to {MAX_TOPIC_LENGTH} of a-z A-Z 0-9 . _ -,"
            " not '.' or '..')"
        ) from None


def _named(fields: list[str]) -> str:
    return ", ".join(f"OUTBOXKIT_KAFKA_{name.upper()} ([kafka] {name})" for name in fields)


def security_problem(kafka: KafkaSettings) -> str | None:
    """Why the SASL and TLS settings do not fit the security protocol, or None. A setting the
    protocol does not use would be dropped without a word: a client meant to log in, or to
    check the broker's certificate, would connect without."""
    # The protocol and the certificate count only as settings: both clients decide from them
    # which settings to pass on, so one given as a librdkafka property would leave them out.
    protocol = kafka.security_protocol.value
    sasl = [name for name in SASL_SETTINGS if getattr(kafka, name) is not None]
    if sasl and not kafka.uses_sasl:
        return (
            f"{_named(sasl)} set, but security protocol {protocol} uses no SASL (set"
            f" {_PROTOCOL} to SASL_SSL or SASL_PLAINTEXT, or leave them out)"
        )
    tls = [name for name in SSL_SETTINGS if getattr(kafka, name) is not None]
    if tls and not kafka.uses_tls:
        return (
            f"{_named(tls)} set, but security protocol {protocol} uses no SSL (set"
            f" {_PROTOCOL} to SSL or SASL_SSL, or leave them out)"
        )
    key = [name for name in SSL_SETTINGS[2:] if getattr(kafka, name) is not None]
    if key and kafka.ssl_certificate_location is None:
        return f"{_named(key)} set without OUTBOXKIT_KAFKA_SSL_CERTIFICATE_LOCATION"
    return None


def topic_template_problem(template: str) -> str | None:
    """Why ``template`` is no topic-name template (``"{topic}.dlq"``, a fixed name), or None.

    Only the ``{topic}`` placeholder is filled in; anything else would fail (``KeyError``) when
    the first record needs it. The problem does not quote the template."""
    try:
        fields = [
            (name, spec, conversion)
            for _, name, spec, conversion in Formatter().parse(template)
            if name is not None
        ]
    except ValueError:
        return "unbalanced braces (write {{ and }} for literal braces)"
    if any(field != ("topic", "", None) for field in fields):
        return "the only placeholder allowed is {topic} (write {{ and }} for literal braces)"
    return None


def storable(what: str) -> AfterValidator:
    """A name PostgreSQL can store and index (it leads a table's key); empty is left to
    ``min_length`` or to the check for a missing name."""

    def check(value: str | None) -> str | None:
        problem = name_problem(value) if value else None
        if problem is not None:
            raise ValueError(f"{what} {problem}")
        return value

    return AfterValidator(check)
