"""Names handed to Kafka from the settings: the consumer's topics, and the client properties
that free-form settings (``[kafka] properties``, the consumer's ``kafka_options``) may not set.

A topic name Kafka refuses is refused when the settings load: a consumer would otherwise log
UNKNOWN_TOPIC_OR_PART for ever instead of stopping.

The typed ``OUTBOXKIT_KAFKA_*`` settings own the connection and its security, and reach both
clients. The same thing given as a property would win for one client only (librdkafka reads the
properties, aiokafka does not): a confluent-kafka client could connect in plaintext, or without
checking the broker's certificate, while the settings, ``config show`` and the aiokafka clients
say otherwise. Properties about SASL or TLS that no typed setting covers (``sasl.oauthbearer.*``,
``sasl.kerberos.*``, ``ssl.ca.pem``, ``ssl.crl.location``, ``ssl.cipher.suites``...) stay
allowed: they add to what the typed settings chose and cannot switch it off.

One exception: the SASL mechanisms the typed settings have no credentials for (OAUTHBEARER,
GSSAPI) are named in ``sasl.mechanism``, beside their own ``sasl.oauthbearer.*`` /
``sasl.kerberos.*`` properties. That is allowed only where it cannot downgrade anything: the
typed protocol is SASL_SSL or SASL_PLAINTEXT and no typed SASL setting is given. Only the
confluent-kafka clients read it; aiokafka's are refused such settings (they would log in with
another mechanism).

Every problem names the property, never its value (the fixed mechanism names excepted).
Names compare case-insensitively, and so do those mechanism names.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from pydantic import SecretStr

from outboxkit.settings.checks import SASL_SETTINGS, topic_name, topic_template_problem

if TYPE_CHECKING:
    from outboxkit.settings.models import KafkaSettings

#: What a dead-letter template is filled with to check it: the shortest topic name.
SAMPLE_TOPIC = "t"


def _setting(name: str) -> str:
    return f"OUTBOXKIT_KAFKA_{name.upper()} ([kafka] {name})"


_TLS = "the OUTBOXKIT_KAFKA_SSL_* settings (under SSL both clients always verify the broker)"
_PROPERTIES = "OUTBOXKIT_KAFKA_PROPERTIES ([kafka] properties)"

#: librdkafka property -> the typed setting that decides it (aliases included).
OWNED_PROPERTIES = {
    "bootstrap.servers": "bootstrap",
    "metadata.broker.list": "bootstrap",
    "security.protocol": "security_protocol",
    "sasl.mechanism": "sasl_mechanism",
    "sasl.mechanisms": "sasl_mechanism",
    "sasl.username": "sasl_username",
    "sasl.password": "sasl_password",
    "ssl.ca.location": "ssl_ca_location",
    "ssl.certificate.location": "ssl_certificate_location",
    "ssl.key.location": "ssl_key_location",
    "ssl.key.password": "ssl_key_password",
    "ssl.endpoint.identification.algorithm": "ssl_check_hostname",
    "enable.ssl.certificate.verification": _TLS,
}
#: aiokafka keyword argument -> the typed setting that decides it.
OWNED_OPTIONS = {
    "bootstrap_servers": "bootstrap",
    "security_protocol": "security_protocol",
    "sasl_mechanism": "sasl_mechanism",
    "sasl_plain_username": "sasl_username",
    "sasl_plain_password": "sasl_password",
    "ssl_context": _TLS,
}
#: Names whose value must be a Python object (a callable, a dict, a class), which text cannot
#: be: confluent-kafka refuses one at every client creation (a relay would retry for ever),
#: aiokafka calls it on the first record.
PYTHON_OBJECTS = frozenset(
    {
        "error_cb",
        "stats_cb",
        "throttle_cb",
        "oauth_cb",
        "logger",
        "on_delivery",
        "on_commit",
        "default.topic.config",
        "key_deserializer",
        "value_deserializer",
        "sasl_oauth_token_provider",
        "partition_assignment_strategy",
    }
)


def owned_problem(names: Iterable[str], owned: dict[str, str]) -> str | None:
    """Why one of ``names`` may not be given (the first, sorted), or None."""
    for name in sorted(str(name) for name in names):
        setting = owned.get(name.strip().lower())
        if setting is not None:
            where = setting if " " in setting else _setting(setting)
            return f"{name!r} is decided by {where}, not by a Kafka property"
    return None


def text_problem(names: Iterable[str], *, options: bool) -> str | None:
    """Why one of ``names``, set from text, may not be: owned by a typed setting, or taking a
    Python object. ``options``: the consumer's options, in either client's spelling (the
    client is chosen elsewhere); else librdkafka properties only."""
    names = list(names)
    owned = {**OWNED_PROPERTIES, **OWNED_OPTIONS} if options else OWNED_PROPERTIES
    problem = owned_problem(names, owned)
    objects = [name for name in sorted(map(str, names)) if name.strip().lower() in PYTHON_OBJECTS]
    if problem is None and objects:
        problem = f"{objects[0]!r} takes a Python object (a callable, a dict), not text"
    if problem is None or options:
        return problem
    return f"{_PROPERTIES}: {problem}"


#: SASL mechanisms ``[kafka] properties`` may name (their credentials are properties too).
PROPERTY_MECHANISMS = ("OAUTHBEARER", "GSSAPI")
#: The librdkafka properties that name the SASL mechanism.
MECHANISM_PROPERTIES = ("sasl.mechanism", "sasl.mechanisms")
_PROTOCOL = "OUTBOXKIT_KAFKA_SECURITY_PROTOCOL ([kafka] security_protocol)"


def is_mechanism_property(name: str) -> bool:
    return name.strip().lower() in MECHANISM_PROPERTIES


def property_mechanism(properties: Mapping[str, object]) -> str | None:
    """The SASL mechanism of :data:`PROPERTY_MECHANISMS` that ``properties`` name (upper-case,
    as librdkafka wants it), or None: none named, another, or more than one."""
    named = {
        (value.get_secret_value() if isinstance(value, SecretStr) else str(value)).strip().upper()
        for name, value in properties.items()
        if is_mechanism_property(str(name))
    }
    mechanism = named.pop() if len(named) == 1 else None
    return mechanism if mechanism in PROPERTY_MECHANISMS else None


def _mechanism_problem(kafka: KafkaSettings, mechanism: str) -> str | None:
    """Why the mechanism named in the properties does not fit the typed settings, or None."""
    given = f"the SASL mechanism they name, {mechanism},"
    if not kafka.uses_sasl:
        return (
            f"{given} needs a SASL protocol: set {_PROTOCOL} to SASL_SSL or SASL_PLAINTEXT"
            f" (it is {kafka.security_protocol.value})"
        )
    typed = [_setting(name) for name in SASL_SETTINGS if getattr(kafka, name) is not None]
    if typed:
        return (
            f"{given} cannot be combined with the SASL settings for PLAIN and SCRAM"
            f" ({', '.join(typed)}): leave out the one or the other"
        )
    return None


def properties_problem(kafka: KafkaSettings) -> str | None:
    """Why ``kafka.properties`` may not be given with these typed settings, or None: a property
    a typed setting owns, one taking a Python object, or a mechanism of
    :data:`PROPERTY_MECHANISMS` where it does not fit (:func:`property_mechanism`)."""
    names = [str(name) for name in kafka.properties]
    mechanism = property_mechanism(kafka.properties)
    if mechanism is not None:
        problem = _mechanism_problem(kafka, mechanism)
        if problem is not None:
            return f"{_PROPERTIES}: {problem}"
        names = [name for name in names if not is_mechanism_property(name)]
    elif any(map(is_mechanism_property, names)):  # PLAIN, SCRAM, a typo or two mechanisms
        name = min(filter(is_mechanism_property, names))
        return (
            f"{_PROPERTIES}: {name!r} is decided by {_setting('sasl_mechanism')}, not by a"
            " Kafka property (one property may name OAUTHBEARER or GSSAPI, under a SASL protocol)"
        )
    return text_problem(names, options=False)


def topic_list(value: list[str]) -> list[str]:
    """Each a Kafka topic name; the problem names the item by its number."""
    for number, topic in enumerate(value, start=1):
        try:
            topic_name(topic)
        except ValueError as exc:
            raise ValueError(f"item {number} of {len(value)} {exc}") from None
    return value


def dead_letter_template(value: str | None) -> str | None:
    """A topic name or a ``{topic}`` template that gives one (filled with a sample topic)."""
    if not value:
        return value
    problem = topic_template_problem(value)
    if problem is not None:
        raise ValueError(problem)
    try:
        topic_name(value.format(topic=SAMPLE_TOPIC))
    except ValueError as exc:
        raise ValueError(f"gives a name that {exc}") from None
    return value
