"""The shared Kafka settings as each client library wants them.

Every client the product creates (producers, consumers, admin, checkpoint reader, dead letters,
acks) is configured from here, so TLS and SASL reach all of them. aiokafka takes TLS as an
``SSLContext``, built from the same file paths librdkafka reads. librdkafka's log lines go to the
``outboxkit.kafka.librdkafka`` logger instead of raw to stderr.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Mapping
from typing import Any

from outboxkit.errors import ConfigurationError
from outboxkit.kafka.errors import with_credentials_hint
from outboxkit.settings import KafkaSettings
from outboxkit.settings.kafka_names import (
    OWNED_OPTIONS,
    OWNED_PROPERTIES,
    PROPERTY_MECHANISMS,
    is_mechanism_property,
    owned_problem,
    properties_problem,
    property_mechanism,
)

LIBRDKAFKA_LOGGER = logging.getLogger("outboxkit.kafka.librdkafka")
logger = logging.getLogger("outboxkit.kafka")
_unread_warned: set[frozenset[str]] = set()  # property sets already named in this process


class _CredentialsHint(logging.Filter):
    """A librdkafka line about a refused login also names the settings to check."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        hinted = with_credentials_hint(message)
        if hinted is not message:
            record.msg, record.args = hinted, None
        return True


LIBRDKAFKA_LOGGER.addFilter(_CredentialsHint())
logging.getLogger("aiokafka").addFilter(_CredentialsHint())  # aiokafka logs a refused login there


def _require_bootstrap(settings: KafkaSettings) -> str:
    if not settings.bootstrap:
        raise ConfigurationError(
            "Kafka bootstrap servers are not set (OUTBOXKIT_KAFKA_BOOTSTRAP or [kafka] bootstrap)"
        )
    return settings.bootstrap


def _check_sasl(settings: KafkaSettings) -> None:
    """The typed SASL settings are complete, or the properties name a mechanism they do not
    cover (:func:`~outboxkit.settings.kafka_names.properties_problem` checks it fits)."""
    if settings.uses_sasl and (
        settings.sasl_mechanism is None
        or settings.sasl_username is None
        or settings.sasl_password is None
    ):
        if property_mechanism(settings.properties) is not None:
            return
        raise ConfigurationError(
            f"security protocol {settings.security_protocol.value} needs"
            " OUTBOXKIT_KAFKA_SASL_MECHANISM, OUTBOXKIT_KAFKA_SASL_USERNAME and"
            " OUTBOXKIT_KAFKA_SASL_PASSWORD (or, for the confluent-kafka clients only,"
            " sasl.mechanism OAUTHBEARER or GSSAPI in OUTBOXKIT_KAFKA_PROPERTIES)"
        )


_PROPERTIES = "OUTBOXKIT_KAFKA_PROPERTIES ([kafka] properties)"
_OPTIONS = "the Kafka consumer's options (config=, OUTBOXKIT_CONSUMER_KAFKA_OPTIONS)"


def _refuse_properties(settings: KafkaSettings) -> None:
    """What :class:`KafkaSettings` checks when it loads, again: a model can be changed after."""
    problem = properties_problem(settings)
    if problem is not None:
        raise ConfigurationError(problem)


def _refuse_owned(given: Mapping[str, Any], owned: dict[str, str], where: str) -> None:
    """A property the typed settings decide would win for this client alone (a downgrade to
    plaintext, say): refused, naming it, however the settings were built."""
    problem = owned_problem(given, owned)
    if problem is not None:
        raise ConfigurationError(f"{where}: {problem}")


def confluent_config(
    settings: KafkaSettings,
    defaults: Mapping[str, Any] | None = None,
    *,
    options: Mapping[str, Any] | None = None,
    **overrides: Any,
) -> dict[str, Any]:
    """librdkafka properties, later wins: ``defaults`` (a client's tuning), connection +
    security + our logger, the user's ``properties``, the caller's ``options`` (a consumer's
    own), then ``overrides`` (what the client needs to keep its contract, e.g.
    ``enable.idempotence``). Neither ``properties`` nor ``options`` may set what the typed
    settings decide (:data:`~outboxkit.settings.kafka_names.OWNED_PROPERTIES`)."""
    _refuse_properties(settings)
    _check_sasl(settings)
    _refuse_owned(options or {}, OWNED_PROPERTIES, _OPTIONS)
    mechanism = property_mechanism(settings.properties)  # None: the typed settings' SASL
    conf: dict[str, Any] = dict(defaults or {})
    conf |= {
        "bootstrap.servers": _require_bootstrap(settings),
        "client.id": settings.client_id,
        "security.protocol": settings.security_protocol.value.lower(),
        "logger": LIBRDKAFKA_LOGGER,
    }
    if settings.uses_sasl and mechanism is None:
        assert settings.sasl_mechanism is not None
        assert settings.sasl_password is not None
        conf["sasl.mechanism"] = settings.sasl_mechanism.value
        conf["sasl.username"] = settings.sasl_username
        conf["sasl.password"] = settings.sasl_password.get_secret_value()
    if settings.uses_tls:
        for name, path in (
            ("ssl.ca.location", settings.ssl_ca_location),
            ("ssl.certificate.location", settings.ssl_certificate_location),
            ("ssl.key.location", settings.ssl_key_location),
        ):
            if path is not None:
                conf[name] = str(path)
        if settings.ssl_key_password is not None:
            conf["ssl.key.password"] = settings.ssl_key_password.get_secret_value()
        conf["ssl.endpoint.identification.algorithm"] = (
            "https" if settings.ssl_check_hostname else "none"
        )
    for name, value in settings.properties.items():
        if mechanism is None or not is_mechanism_property(name):
            conf[name] = value.get_secret_value()
    if mechanism is not None:  # in librdkafka's spelling, whatever case it was given in
        conf["sasl.mechanism"] = mechanism
    conf.update(options or {})
    conf.update(overrides)
    return conf


CONSUMER_OPTIONS_HINT = (
    "check OUTBOXKIT_CONSUMER_KAFKA_OPTIONS ([consumer] kafka_options, --kafka-option)"
    " and the OUTBOXKIT_KAFKA_* settings"
)


def refused_configuration(
    what: str, code: str, text: str, conf: Mapping[str, Any], hint: str
) -> ConfigurationError:
    """librdkafka's refusal of a client's configuration (error ``code``, message ``text``) as a
    :class:`ConfigurationError` naming the properties, never their values: librdkafka quotes
    some values (``Invalid value "..." for configuration property``, ``Unsupported SASL
    mechanism: ...``), and a value may be a secret."""
    names = [name for name in conf if isinstance(name, str) and name]
    named = sorted(name for name in names if f'"{name}"' in text)  # librdkafka quotes them
    named = named or sorted(name for name in names if name in text)
    if not named and "Unsupported SASL mechanism" in text:  # it quotes the value only
        named = sorted(name for name in names if name.startswith("sasl.mechanism"))
    mechanism = conf.get("sasl.mechanism")
    if "No provider for SASL mechanism" in text and mechanism in PROPERTY_MECHANISMS:
        problem = (
            f"this librdkafka build has no SASL mechanism {mechanism} (GSSAPI needs librdkafka"
            " built with libsasl2: the confluent-kafka wheels from PyPI lack it)"
        )
    elif text.startswith("No such configuration property") and named:
        problem = f"unknown property {', '.join(map(repr, named))}"
    elif named:
        problem = f"the value of {', '.join(map(repr, named))} is not accepted"
    else:
        problem = f"the configuration is not accepted ({code})"
    return ConfigurationError(f"{what}: {problem} (values not shown; {hint})")


def ssl_context(settings: KafkaSettings) -> ssl.SSLContext:
    """A client TLS context from the CA / certificate / key paths librdkafka would read."""
    try:
        context = ssl.create_default_context(
            cafile=str(settings.ssl_ca_location) if settings.ssl_ca_location else None
        )
        if settings.ssl_certificate_location is not None:
            password = settings.ssl_key_password
            context.load_cert_chain(
                str(settings.ssl_certificate_location),
                str(settings.ssl_key_location) if settings.ssl_key_location else None,
                password.get_secret_value() if password is not None else None,
            )
    except (OSError, ssl.SSLError) as exc:
        raise ConfigurationError(
            f"cannot build the Kafka TLS context from OUTBOXKIT_KAFKA_SSL_* paths: {exc}"
        ) from None
    context.check_hostname = settings.ssl_check_hostname
    if not settings.ssl_check_hostname:
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def aiokafka_options(
    settings: KafkaSettings,
    defaults: Mapping[str, Any] | None = None,
    *,
    options: Mapping[str, Any] | None = None,
    **overrides: Any,
) -> dict[str, Any]:
    """aiokafka keyword arguments, later wins: ``defaults``, connection + security, the
    caller's ``options`` (which may not set what the typed settings decide), then
    ``overrides``. ``properties`` are librdkafka names, which aiokafka does not read: said in a
    warning (names only, once per process and set of names), as a silently ignored setting
    would be a trap; a SASL mechanism named there is refused (it would be a wrong login)."""
    _refuse_owned(options or {}, OWNED_OPTIONS, _OPTIONS)
    mechanism = property_mechanism(settings.properties)
    if mechanism is not None:
        raise ConfigurationError(
            f"{_PROPERTIES} choose SASL mechanism {mechanism}, which only the confluent-kafka"
            " clients read: an aiokafka client would log in with another (set"
            " OUTBOXKIT_KAFKA_CLIENT to confluent; AiokafkaInboxConsumer is aiokafka's only)"
        )
    _check_sasl(settings)
    names = frozenset(settings.properties)
    if names and names not in _unread_warned:
        _unread_warned.add(names)
        logger.warning(
            "[kafka] properties %s are librdkafka properties: they apply to the confluent-kafka"
            " clients only, and this process builds an aiokafka client, which does not read"
            " them (remove them if no client here is confluent-kafka's)",
            ", ".join(sorted(names)),
        )
    kwargs: dict[str, Any] = dict(defaults or {})
    kwargs |= {
        "bootstrap_servers": _require_bootstrap(settings),
        "client_id": settings.client_id,
        "security_protocol": settings.security_protocol.value,
    }
    if settings.uses_sasl:
        assert settings.sasl_mechanism is not None
        assert settings.sasl_password is not None
        kwargs["sasl_mechanism"] = settings.sasl_mechanism.value
        kwargs["sasl_plain_username"] = settings.sasl_username
        kwargs["sasl_plain_password"] = settings.sasl_password.get_secret_value()
    if settings.uses_tls:
        kwargs["ssl_context"] = ssl_context(settings)
    kwargs.update(options or {})
    kwargs.update(overrides)
    return kwargs
