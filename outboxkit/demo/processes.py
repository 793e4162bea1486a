"""The demo's relay and consumer processes: real ``outboxkit`` processes, as in production.

Their output (relay logs, librdkafka/aiokafka chatter, the fault-point notice) goes to one log
file each in the run's log folder, never to the demo's screen.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from outboxkit.devstack.process import dies_with_parent
from outboxkit.faults import FAULT_ENV
from outboxkit.kafka import resolve_client
from outboxkit.settings import DatabaseSettings, KafkaClient, KafkaSettings


@dataclass(frozen=True)
class Services:
    """Where everything runs, and the names this run uses (fresh per run)."""

    database_url: str
    kafka_bootstrap: str
    run_id: str
    log_dir: Path
    lease_ttl: float = 3.0
    # false behind a pooler that cannot keep them: for the demo's connections and its children's
    prepared_statements: bool = True

    @property
    def connect_options(self) -> dict[str, Any]:
        """psycopg's options for the demo's own connections."""
        chosen = DatabaseSettings.model_construct(prepared_statements=self.prepared_statements)
        return chosen.connect_options()  # (model_construct: no environment read)

    @property
    def topic(self) -> str:
        return f"demo.orders.{self.run_id}"

    @property
    def relay_group(self) -> str:
        return f"demo-{self.run_id}"

    @property
    def consumer(self) -> str:
        """The inbox's consumer name and the Kafka group: a run never counts an earlier one's."""
        return f"demo-billing-{self.run_id}"

    def base_env(self) -> dict[str, str]:
        """This environment with the demo's settings: Kafka's (client, security) are kept, any
        other ``OUTBOXKIT_*`` (a fault point, relay tuning) would change the story."""
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("OUTBOXKIT_") or k.startswith("OUTBOXKIT_KAFKA_")
        }
        return {
            **env,
            "OUTBOXKIT_DATABASE_URL": self.database_url,
            "OUTBOXKIT_DATABASE_PREPARED_STATEMENTS": str(self.prepared_statements).lower(),
            "OUTBOXKIT_KAFKA_BOOTSTRAP": self.kafka_bootstrap,
            "PYTHONUNBUFFERED": "1",
        }


class DemoProcess:
    """One child process, its log file, and how it ended."""

    def __init__(self, name: str, command: list[str], env: dict[str, str], log: Path) -> None:
        self.name = name
        self.log = log
        with log.open("ab") as out:
            self.proc = subprocess.Popen(
                command,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                # Killed with the demo (a SIGKILL or SIGTERM skips its clean-up): before, the
                # relay and the consumer went on against servers that had died with it.
                preexec_fn=dies_with_parent,  # fork-safe: libc was loaded before
            )

    def rename(self, name: str) -> None:
        """Its role is known once it runs: name it (and its log file) after it."""
        self.name = name
        log = self.log.with_name(f"{name.replace(' ', '-')}.log")
        self.log = self.log.rename(log)  # the child keeps writing to the same file

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def exit_code(self) -> int | None:
        return self.proc.poll()

    def kill(self) -> None:
        """SIGKILL: no clean-up, no lease release, no offset commit."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self, timeout: float = 20.0) -> None:
        if self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            self.proc.terminate()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()


def start_relay(services: Services, name: str) -> DemoProcess:
    env = {
        **services.base_env(),
        "OUTBOXKIT_RELAY_GROUP": services.relay_group,
        "OUTBOXKIT_RELAY_LEASE_TTL": str(services.lease_ttl),
        "OUTBOXKIT_RELAY_POLL_INTERVAL": "0.25",
        "OUTBOXKIT_RELAY_BACKOFF_MAX": "1",
        "OUTBOXKIT_RELAY_CHECKPOINT_TOPIC": f"outboxkit.checkpoint.{services.run_id}",
    }
    command = [sys.executable, "-m", "outboxkit.relay", "run"]
    return DemoProcess(name, command, env, services.log_dir / f"{name.replace(' ', '-')}.log")


def _client_options(instance: str) -> list[str]:
    """The handlers for the driver the child will pick (sync for confluent-kafka, asyncio for
    aiokafka), and static membership: the restarted consumer takes its killed predecessor's
    place at once instead of the group waiting out the dead member's session."""
    if resolve_client(KafkaSettings()) is KafkaClient.CONFLUENT:  # as the child will decide
        registry = "REGISTRY"
        pairs = {"group.instance.id": instance, "session.timeout.ms": "6000"}
    else:
        registry = "ASYNC_REGISTRY"
        pairs = {"group_instance_id": instance, "session_timeout_ms": "6000"}
    options = [part for pair in pairs.items() for part in ("--kafka-option", "=".join(pair))]
    return ["--registry", f"outboxkit.demo.app:{registry}", *options]


def start_consumer(services: Services, name: str, fault: str | None = None) -> DemoProcess:
    """``outboxkit inbox run`` with the demo's handler; ``fault`` arms a fault point."""
    env = services.base_env()
    if fault:
        env[FAULT_ENV] = fault
    command = [
        sys.executable,
        "-m",
        "outboxkit.inbox.worker",
        "--consumer",
        services.consumer,
        "--group",
        services.consumer,
        "--topic",
        services.topic,
        "--dead-letter-check",
        "off",
        "--retention-window",
        "0",
        *_client_options(services.consumer),
    ]
    return DemoProcess(name, command, env, services.log_dir / "consumer.log")
