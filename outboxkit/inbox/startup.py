"""A consumer process's start-up: wait out a database or broker that is not there yet.

``outboxkit inbox run`` started before PostgreSQL or Kafka (a node reboot, a rolling restart of
the platform) must not crash-loop: like the relay, it says what it waits for and retries with
back-off until it is stopped. What waiting cannot fix — a malformed URL, a schema that is missing
or not migrated — ends the process at once with one line.
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
from collections.abc import Callable, Coroutine
from typing import Any

import psycopg

from outboxkit import db
from outboxkit.db import migrator
from outboxkit.db.connect import refused
from outboxkit.errors import PublishError
from outboxkit.kafka.errors import with_credentials_hint
from outboxkit.log_limit import LimitedLines, normalised
from outboxkit.relay.retry_log import SHOWN_IN_FULL
from outboxkit.relay.waiting import backoff_delay
from outboxkit.settings import Settings

logger = logging.getLogger("outboxkit.inbox.worker")

BACKOFF_INITIAL = 0.5
BACKOFF_MAX = 10.0


def wait_until_ready(
    config: Settings,
    kafka_check: Callable[[], Coroutine[Any, Any, None]],
    stop: threading.Event,
) -> bool:
    """True once the inbox schema is current and ``kafka_check`` passed; False if stopped."""
    connections = db.OpenConnections()  # a stop the database does not answer still ends
    answers = db.answers(config.database_url, **config.database.connect_options())
    with db.StopWatchdog(connections, stop.is_set, answers):
        return _wait(config, kafka_check, stop, connections)


def _wait(
    config: Settings,
    kafka_check: Callable[[], Coroutine[Any, Any, None]],
    stop: threading.Event,
    connections: db.OpenConnections,
) -> bool:
    """:func:`wait_until_ready`'s loop, its connections tracked."""
    url = config.database_url
    rng = random.Random()
    attempt = 0
    # A long outage: the first attempts' lines (the back-off growing), then one a minute.
    said = LimitedLines(logger, shown_in_full=SHOWN_IN_FULL)
    while not stop.is_set():
        try:
            with db.connect(url, track=connections, **db.connect_timeout(url)) as conn:
                migrator.require_current(conn, config.schema_name)
            asyncio.run(kafka_check())
            said.answered()
            said.end(logging.INFO, "PostgreSQL and Kafka answer after %.1f s of waiting")
            return True
        except psycopg.ProgrammingError as exc:  # a malformed URL, missing grants
            raise refused(exc, url) from None
        except (psycopg.OperationalError, OSError) as exc:
            what = f"PostgreSQL at {db.redact(url.get_secret_value(), url)}"
            problem = db.redact(str(exc).strip(), url)
        except PublishError as exc:
            what = f"Kafka at {config.kafka.bootstrap}"
            problem = with_credentials_hint(str(exc))
        attempt += 1
        delay = backoff_delay(attempt, BACKOFF_INITIAL, BACKOFF_MAX, rng)
        first = problem.splitlines()[0] if problem else "unavailable"
        said.log(
            logging.WARNING,
            normalised(f"{what}: {first}"),
            "consumer waiting for %s (%s); retrying in %.1fs",
            what,
            first,
            delay,
        )
        stop.wait(delay)
    return False
