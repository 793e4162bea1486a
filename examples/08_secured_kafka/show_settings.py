"""Example 08: secured Kafka (SASL_SSL) as configuration, checked before anything connects.

Loads the settings as every outboxkit process does (defaults < ``outboxkit.toml`` <
``OUTBOXKIT_*`` variables < secret files in ``OUTBOXKIT_SECRETS_DIR``) and prints the effective
Kafka settings with the password masked. A missing password is reported by name, never by value.
The same settings drive ``outboxkit relay run``, ``outboxkit inbox run`` and the embedded relay.

    OUTBOXKIT_KAFKA_SASL_PASSWORD=... python examples/08_secured_kafka/show_settings.py
    outboxkit config show --config examples/08_secured_kafka/outboxkit.toml   # the same, all
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from outboxkit import ConfigurationError
from outboxkit.settings import Settings, load_settings

HERE = Path(__file__).resolve().parent


def load(path: Path = HERE / "outboxkit.toml") -> Settings:
    """The settings, refusing a SASL protocol without its mechanism, user and password."""
    settings = load_settings(path)
    kafka = settings.kafka
    if kafka.uses_sasl:
        missing = [
            f"OUTBOXKIT_KAFKA_SASL_{name.upper()}"
            for name, value in [
                ("mechanism", kafka.sasl_mechanism),
                ("username", kafka.sasl_username),
                ("password", kafka.sasl_password),
            ]
            if value is None
        ]
        if missing:
            raise ConfigurationError(f"{kafka.security_protocol} needs {', '.join(missing)}")
    return settings


def main(path: Path = HERE / "outboxkit.toml") -> str:
    """The effective Kafka settings as JSON, secrets masked."""
    return json.dumps(load(path).redacted()["kafka"], indent=2)


if __name__ == "__main__":
    try:
        print(main(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "outboxkit.toml"))
    except ConfigurationError as exc:
        sys.exit(f"error: {exc}")
