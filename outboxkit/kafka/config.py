"""The shared Kafka settings as each client library wants them.

Every client the product creates (producers, consumers, admin, checkpoint reader, dead letters,
acks) is configured from here, so TLS and SASL reach all of them. aiokafka takes TLS as an
``SSLContext``, built from the same file paths librdkafka reads. librdkafka's log lines go to the
``outboxkit.kafka.librdkafka`` logger instead of raw to stderr, rate-limited per client
(:mod:`outboxkit.kafka.librdkafka_log`).
"""

from __future__ import annotations

import logging
import os
import ssl
from collections.abc import Iterator, Mapping
from typing import Any

from outboxkit.errors import ConfigurationError
from outboxkit.kafka.aiokafka_log import limit_aiokafka_log
from outboxkit.kafka.errors import with_credentials_hint
from outboxkit.kafka.librdkafka_log import LibrdkafkaLog
from outboxkit.kafka.log_secrets import SecretMask, is_secret_name
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


_CERTIFICATE_REFUSED = (
    "alert bad certificate",
    "alert certificate required",
    "alert certificate unknown",  # Java's answer to a client certificate it could not validate
    "alert certificate expired",
)
CLIENT_CERTIFICATE_HINT = (
    "the broker refused the TLS handshake: it requires a client certificate signed by a CA it"
    " trusts (check OUTBOXKIT_KAFKA_SSL_CERTIFICATE_LOCATION and OUTBOXKIT_KAFKA_SSL_KEY_LOCATION)"
)


def _with_certificate_hint(text: str) -> str:
    """OpenSSL reports a listener requiring client auth only as a TLS alert number."""
    lowered = text.lower()
    if CLIENT_CERTIFICATE_HINT in text or not any(m in lowered for m in _CERTIFICATE_REFUSED):
        return text
    return f"{text} ({CLIENT_CERTIFICATE_HINT})"


class _CredentialsHint(logging.Filter):
    """A librdkafka line about a refused login or client certificate also names the settings
    to check."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        hinted = _with_certificate_hint(with_credentials_hint(message))
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
    settings decide (:data:`~outboxkit.settings.kafka_names.OWNED_PROPERTIES`). The logger is
    a new :class:`LibrdkafkaLog` each call: its rate limits are this configuration's alone."""
    _refuse_properties(settings)
    _check_sasl(settings)
    _refuse_owned(options or {}, OWNED_PROPERTIES, _OPTIONS)
    mechanism = property_mechanism(settings.properties)  # None: the typed settings' SASL
    conf: dict[str, Any] = dict(defaults or {})
    conf |= {
        "bootstrap.servers": _require_bootstrap(settings),
        "client.id": settings.client_id,
        "security.protocol": settings.security_protocol.value.lower(),
        "logger": LibrdkafkaLog(LIBRDKAFKA_LOGGER, mask=SecretMask(_secrets(settings, options))),
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


def _secrets(
    settings: KafkaSettings, options: Mapping[str, Any] | None
) -> Iterator[tuple[str, str]]:
    """The values a client's log lines must not show (:mod:`.log_secrets`), by setting."""
    for name, secret in (
        ("OUTBOXKIT_KAFKA_SASL_PASSWORD", settings.sasl_password),
        ("OUTBOXKIT_KAFKA_SSL_KEY_PASSWORD", settings.ssl_key_password),
    ):
        if secret is not None:
            yield name, secret.get_secret_value()
    for name, value in settings.properties.items():
        if is_secret_name(name):
            yield name, value.get_secret_value()
    for name, option in (options or {}).items():
        if is_secret_name(str(name)) and isinstance(option, str):
            yield str(name), option


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
    elif {"ssl.certificate.location", "ssl.key.location"} & set(named):
        problem = client_key_problem(
            conf.get("ssl.certificate.location"),
            conf.get("ssl.key.location"),
            conf.get("ssl.key.password") is not None,
            text,
        )
    elif named:
        problem = f"the value of {', '.join(map(repr, named))} is not accepted"
    else:
        problem = f"the configuration is not accepted ({code})"
    return ConfigurationError(f"{what}: {problem} (values not shown; {hint})")


def _pem_head(location: Any) -> bytes:
    """The start of a PEM file (enough for a certificate chain before its key), or nothing if
    it is not a regular readable file (a FIFO would block the read)."""
    path = str(location or "")
    try:
        if not os.path.isfile(path):
            return b""
        with open(path, "rb") as file:
            return file.read(1 << 16)
    except (OSError, ValueError):
        return b""


def client_key_problem(certificate: Any, key: Any, has_password: bool, detail: str = "") -> str:
    """Why a client certificate and key did not load, as far as the files tell: neither OpenSSL
    caller says a key's password is wrong or missing (both report "PEM lib"). ``detail``, the
    library's own message, is matched only, never shown."""
    if "key values mismatch" in detail.lower():
        return (
            "the client key is not the key of OUTBOXKIT_KAFKA_SSL_CERTIFICATE_LOCATION"
            " (OUTBOXKIT_KAFKA_SSL_KEY_LOCATION)"
        )
    if b"-----BEGIN CERTIFICATE-----" not in _pem_head(certificate):
        return (
            "OUTBOXKIT_KAFKA_SSL_CERTIFICATE_LOCATION is not a readable PEM certificate"
            " (missing, not readable, or not PEM)"
        )
    encrypted = b"ENCRYPTED" in _pem_head(key or certificate)  # PKCS#8 or legacy PEM header
    if encrypted and not has_password:
        return "the client key is encrypted and OUTBOXKIT_KAFKA_SSL_KEY_PASSWORD is not set"
    if encrypted:
        return (
            "the client key cannot be decrypted with OUTBOXKIT_KAFKA_SSL_KEY_PASSWORD (a wrong"
            " password?), or it is not the key of OUTBOXKIT_KAFKA_SSL_CERTIFICATE_LOCATION"
        )
    return (
        "the client key cannot be loaded (OUTBOXKIT_KAFKA_SSL_KEY_LOCATION: missing, not"
        " readable, not PEM, or not the key of OUTBOXKIT_KAFKA_SSL_CERTIFICATE_LOCATION)"
    )


_MAX_KEY_PASSWORD = 1024  # bytes, the most Python's ssl module passes to OpenSSL


def _bytes_of(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")  # a variable's byte that is not UTF-8 too


def _no_prompt() -> str:
    """The key password when none is set: else OpenSSL asks for it on the terminal, which would
    block a relay started from a shell (and fail, oddly, one without a terminal)."""
    return ""


def ssl_context(settings: KafkaSettings) -> ssl.SSLContext:
    """A client TLS context from the CA / certificate / key paths librdkafka would read."""
    try:
        context = ssl.create_default_context(
            cafile=str(settings.ssl_ca_location) if settings.ssl_ca_location else None
        )
    except (OSError, ssl.SSLError) as exc:
        raise ConfigurationError(
            f"cannot build the Kafka TLS context from OUTBOXKIT_KAFKA_SSL_* paths: {exc}"
        ) from None
    if settings.ssl_certificate_location is not None:
        password = settings.ssl_key_password
        key = settings.ssl_key_location
        if password is not None and len(_bytes_of(password.get_secret_value())) > _MAX_KEY_PASSWORD:
            raise ConfigurationError(
                "cannot build the Kafka TLS context: OUTBOXKIT_KAFKA_SSL_KEY_PASSWORD is longer"
                " than the 1,024 bytes Python's ssl module (the aiokafka clients) accepts"
            )
        try:
            context.load_cert_chain(
                str(settings.ssl_certificate_location),
                str(key) if key is not None else None,
                password.get_secret_value() if password is not None else _no_prompt,
            )
        except ssl.SSLError as exc:  # the key file's, or the certificate's if it holds the key
            problem = client_key_problem(
                settings.ssl_certificate_location, key, password is not None, str(exc)
            )
            raise ConfigurationError(
                f"cannot build the Kafka TLS context: {problem} ({exc})"
            ) from None
        except OSError as exc:
            raise ConfigurationError(
                f"cannot build the Kafka TLS context from OUTBOXKIT_KAFKA_SSL_* paths: {exc}"
            ) from None
        except ValueError as exc:  # a path with a NUL, say: its text may quote a value
            raise ConfigurationError(
                "cannot build the Kafka TLS context from OUTBOXKIT_KAFKA_SSL_* settings:"
                f" {type(exc).__name__} (its text is not shown)"
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
    would be a trap; a SASL mechanism named there is refused (it would be a wrong login).
    aiokafka's own log lines are rate-limited from here on (:mod:`.aiokafka_log`)."""
    _refuse_owned(options or {}, OWNED_OPTIONS, _OPTIONS)
    limit_aiokafka_log(_secrets(settings, options))
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


def aiokafka_reader_options(settings: KafkaSettings, seconds: float) -> dict[str, Any]:
    """A group-less ``read_committed`` reader from the log's start (read-backs, checkpoints)."""
    return aiokafka_options(
        settings,
        group_id=None,
        isolation_level="read_committed",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        request_timeout_ms=int(seconds * 1000),
    )
