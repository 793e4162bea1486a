"""Creating a confluent-kafka client whose configuration librdkafka may refuse.

librdkafka checks a configuration when the client is created and quotes some values in its
refusal ("Unsupported SASL mechanism: ..."); a value may be a secret put in the wrong place.
Every confluent client is created here, so a refused configuration is always a
:class:`ConfigurationError` naming the properties, never their values.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from confluent_kafka import KafkaError, KafkaException

from outboxkit.kafka.config import refused_configuration

Client = TypeVar("Client")

#: Where the relay's and the tools' Kafka properties come from.
KAFKA_SETTINGS_HINT = "check the OUTBOXKIT_KAFKA_* settings ([kafka] in the config file)"


def create(
    factory: Callable[[dict[str, Any]], Client],
    conf: dict[str, Any],
    what: str,
    hint: str = KAFKA_SETTINGS_HINT,
) -> Client:
    """``factory(conf)``, or the typed refusal of ``conf``."""
    try:
        return factory(conf)
    except KafkaException as exc:  # an unknown property, a value librdkafka refuses
        error = exc.args[0] if exc.args else None
        code, text = ("unknown error", "")
        if isinstance(error, KafkaError):
            code, text = error.name(), error.str()
        raise refused_configuration(what, code, text, conf, hint) from None
    except (TypeError, ValueError) as exc:
        # confluent-kafka's own check of a value it reads itself (a callback that is not
        # callable, a flag that is not a bool): as permanent as librdkafka's refusal.
        raise refused_configuration(what, type(exc).__name__, str(exc), conf, hint) from None
