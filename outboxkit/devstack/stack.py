"""PostgreSQL + Kafka together, or the external ones named by environment variables."""

from __future__ import annotations

import logging
import os
import shlex
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import TracebackType

from outboxkit.db.connect import redact
from outboxkit.devstack.kafka import KafkaServer, Security
from outboxkit.devstack.postgres import PostgresServer
from outboxkit.devstack.registry import reap_orphans
from outboxkit.devstack.sasl import BOOTSTRAP_ENV, SaslSslListener

logger = logging.getLogger("outboxkit.devstack")

DATABASE_URL_ENV = "OUTBOXKIT_DATABASE_URL"
KAFKA_BOOTSTRAP_ENV = BOOTSTRAP_ENV


def redact_url(url: str) -> str:
    """The URL with its password values masked, as every outboxkit message shows one (for
    output a user may paste anywhere)."""
    return redact(url, url)


@dataclass
class DevStack:
    """The services tests and the demo run against.

    ``postgres``/``kafka`` are ``None`` when the corresponding environment variable points at an
    external service; fault tests that need to restart a service skip in that case. Such a choice
    is never silent: it is logged and listed in :attr:`external` (service -> variable).
    With ``kafka_security="sasl_ssl"`` clients reach Kafka over SASL_SSL (see
    :attr:`kafka_sasl_ssl`); an external Kafka must then be described by all the
    ``OUTBOXKIT_KAFKA_*`` security variables.
    """

    durable: bool = False
    kafka_security: Security = "plaintext"
    postgres: PostgresServer | None = None
    kafka: KafkaServer | None = None
    startup_seconds: dict[str, float] = field(default_factory=dict)
    external: dict[str, str] = field(default_factory=dict)
    _database_url: str | None = field(default=None, repr=False)  # may hold a password
    _kafka_bootstrap: str | None = None
    _kafka_sasl_ssl: SaslSslListener | None = None

    @property
    def database_url(self) -> str:
        if self._database_url:
            return self._database_url
        assert self.postgres is not None, "stack not started"
        return self.postgres.url

    @property
    def kafka_bootstrap(self) -> str:
        """Where clients connect (the SASL_SSL listener when ``kafka_security="sasl_ssl"``)."""
        if self._kafka_sasl_ssl is not None:
            return self._kafka_sasl_ssl.bootstrap
        if self._kafka_bootstrap:
            return self._kafka_bootstrap
        assert self.kafka is not None, "stack not started"
        return self.kafka.bootstrap

    @property
    def kafka_sasl_ssl(self) -> SaslSslListener | None:
        """Credentials and CA for the SASL_SSL listener; ``None`` for a plaintext stack."""
        if self._kafka_sasl_ssl is not None:
            return self._kafka_sasl_ssl
        if self.kafka is not None and self.kafka.security == "sasl_ssl":
            return self.kafka.sasl_ssl
        return None

    def _choose_external(self, environ: Mapping[str, str]) -> None:
        self._database_url = environ.get(DATABASE_URL_ENV) or None
        self._kafka_bootstrap = environ.get(KAFKA_BOOTSTRAP_ENV) or None
        if self._database_url:
            self.external["postgresql"] = DATABASE_URL_ENV
            logger.warning(
                "PostgreSQL: using the external server named by %s (%s), not starting one",
                DATABASE_URL_ENV,
                redact_url(self._database_url),
            )
        if self._kafka_bootstrap:
            self.external["kafka"] = KAFKA_BOOTSTRAP_ENV
            if self.kafka_security == "sasl_ssl":
                self._kafka_sasl_ssl = SaslSslListener.from_env(environ)
            logger.warning(
                "Kafka: using the external broker named by %s (%s), not starting one",
                KAFKA_BOOTSTRAP_ENV,
                self._kafka_bootstrap,
            )

    def start(self, environ: Mapping[str, str] | None = None) -> DevStack:
        """Start what the environment (default ``os.environ``) does not name as external."""
        reaped = reap_orphans()
        if reaped:
            logger.warning("cleaned up %d service(s) left by an earlier run", reaped)
        self._choose_external(os.environ if environ is None else environ)
        try:
            if self._database_url is None:
                started = time.monotonic()
                self.postgres = PostgresServer(durable=self.durable)
                self.postgres.start()
                self.startup_seconds["postgresql"] = time.monotonic() - started
            if self._kafka_bootstrap is None:
                started = time.monotonic()
                self.kafka = KafkaServer(security=self.kafka_security)
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

    def env(self) -> dict[str, str]:
        """The ``OUTBOXKIT_*`` variables that point a process at this stack."""
        values = {DATABASE_URL_ENV: self.database_url}
        listener = self.kafka_sasl_ssl
        if listener is not None:
            values |= listener.env()
        else:
            values[KAFKA_BOOTSTRAP_ENV] = self.kafka_bootstrap
        return values

    def export_lines(self) -> list[str]:
        """``export`` lines for a POSIX shell, every value quoted."""
        return export_lines(self.env())

    def describe(self) -> list[str]:
        """One line per service: where it is, and whether it was started here or is external."""
        lines = []
        if "postgresql" in self.external:
            origin = f"external, from {self.external['postgresql']}; not started here"
        else:
            origin = f"started in {self.startup_seconds.get('postgresql', 0.0):.1f}s"
        lines.append(f"PostgreSQL: {redact_url(self.database_url)} ({origin})")
        if "kafka" in self.external:
            origin = f"external, from {self.external['kafka']}; not started here"
        else:
            origin = f"started in {self.startup_seconds.get('kafka', 0.0):.1f}s"
        listener = self.kafka_sasl_ssl
        if listener is not None:
            lines.append(
                f"Kafka:      {listener.bootstrap} ({listener.protocol} {listener.mechanism},"
                f" user {listener.username}, CA {listener.ca_location}; {origin})"
            )
        else:
            lines.append(f"Kafka:      {self.kafka_bootstrap} ({origin})")
        if self.kafka is not None and listener is not None:
            lines.append(
                f"            unauthenticated loopback listener for set-up only:"
                f" {self.kafka.plaintext_bootstrap}"
            )
        return lines

    def __enter__(self) -> DevStack:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def export_lines(values: Mapping[str, str]) -> list[str]:
    """``export NAME=value`` lines with each value quoted by :func:`shlex.quote`."""
    return [f"export {name}={shlex.quote(value)}" for name, value in values.items()]
