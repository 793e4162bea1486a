"""PostgreSQL + Kafka together, or the external ones named by environment variables."""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from types import TracebackType

from outboxkit.devstack.kafka import KafkaServer
from outboxkit.devstack.postgres import PostgresServer
from outboxkit.devstack.process import reap_orphans

logger = logging.getLogger("outboxkit.devstack")

DATABASE_URL_ENV = "OUTBOXKIT_DATABASE_URL"
KAFKA_BOOTSTRAP_ENV = "OUTBOXKIT_KAFKA_BOOTSTRAP"


@dataclass
class DevStack:
    """The services tests and the demo run against.

    ``postgres``/``kafka`` are ``None`` when the corresponding environment variable points at an
    external service; fault tests that need to restart a service skip in that case.
    """

    durable: bool = False
    postgres: PostgresServer | None = None
    kafka: KafkaServer | None = None
    startup_seconds: dict[str, float] = field(default_factory=dict)
    _database_url: str | None = None
    _kafka_bootstrap: str | None = None

    @property
    def database_url(self) -> str:
        if self._database_url:
            return self._database_url
        assert self.postgres is not None, "stack not started"
        return self.postgres.url

    @property
    def kafka_bootstrap(self) -> str:
        if self._kafka_bootstrap:
            return self._kafka_bootstrap
        assert self.kafka is not None, "stack not started"
        return self.kafka.bootstrap

    def start(self) -> DevStack:
        reaped = reap_orphans()
        if reaped:
            logger.warning("cleaned up %d service(s) left by an earlier run", reaped)
        self._database_url = os.environ.get(DATABASE_URL_ENV) or None
        self._kafka_bootstrap = os.environ.get(KAFKA_BOOTSTRAP_ENV) or None
        try:
            if self._database_url is None:
                started = time.monotonic()
                self.postgres = PostgresServer(durable=self.durable)
                self.postgres.start()
                self.startup_seconds["postgresql"] = time.monotonic() - started
            if self._kafka_bootstrap is None:
                started = time.monotonic()
                self.kafka = KafkaServer()
                self.kafka.start()
                self.startup_seconds["kafka"] = time.monotonic() - started
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for server in (self.kafka, self.postgres):
            if server is not None:
                try:
                    server.stop()
                finally:
                    server.destroy()

    def export_lines(self) -> list[str]:
        return [
            f"export {DATABASE_URL_ENV}={self.database_url}",
            f"export {KAFKA_BOOTSTRAP_ENV}={self.kafka_bootstrap}",
        ]

    def __enter__(self) -> DevStack:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
