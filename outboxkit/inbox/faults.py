"""Crash points for the process-level fault tests (inactive unless ``OUTBOXKIT_FAULT`` is set).

``OUTBOXKIT_FAULT=after_db_commit`` makes the consumer SIGKILL itself right after the handler's
transaction committed and before the Kafka offset commit; ``before_db_commit`` right before it.
"""

from __future__ import annotations

import os
import signal

FAULT_ENV = "OUTBOXKIT_FAULT"


def fault_point(name: str) -> None:
    if os.environ.get(FAULT_ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)
