"""The environment of a command the tests start as a user would: this process's variables
without any stray ``OUTBOXKIT_*`` setting, pointed at the session's services."""

from __future__ import annotations

import os


def service_env(database_url: str, kafka_bootstrap: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOXKIT_")}
    env |= {"OUTBOXKIT_DATABASE_URL": database_url, "OUTBOXKIT_KAFKA_BOOTSTRAP": kafka_bootstrap}
    return env | extra
