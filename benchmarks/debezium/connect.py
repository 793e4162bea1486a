"""One Kafka Connect standalone worker (a JVM) and the few REST calls the benchmark needs.

The worker runs as a dev-stack service process: its own process group, killed with its parent,
stopped with SIGTERM (then SIGKILL for the group) and listed in the registry that the next run
cleans up after a crash. Its REST API listens on loopback only.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from types import TracebackType
from typing import Any

from benchmarks.debezium.config import (
    LOG4J2_CONFIG,
    distributed_worker_properties,
    worker_properties,
)
from benchmarks.debezium.jars import ConnectJars
from outboxkit.devstack.process import ServiceProcess, free_port, log_tail

HEAP = "-Xmx1g"


class ConnectError(RuntimeError):
    """The worker or a connector did not reach the expected state."""


def java() -> str:
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").exists():
        return str(Path(home) / "bin" / "java")
    found = shutil.which("java")
    if found is None:
        raise ConnectError("Java 17+ is needed for Kafka Connect (apt-get install openjdk-17-jre)")
    return found


class ConnectWorker:
    def __init__(self, jars: ConnectJars, bootstrap: str, *, distributed: bool = False) -> None:
        self.jars = jars
        self.bootstrap = bootstrap
        self.distributed = distributed
        self.base_dir = Path(tempfile.mkdtemp(prefix="outboxkit-connect-"))
        self.port = free_port()
        self.service: ServiceProcess | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.base_dir / "connect.log"

    def start(self, timeout: float = 120.0) -> ConnectWorker:
        props = self.base_dir / "worker.properties"
        if self.distributed:
            main = "org.apache.kafka.connect.cli.ConnectDistributed"
            text = distributed_worker_properties(
                bootstrap=self.bootstrap,
                rest_port=self.port,
                plugin_path=self.jars.plugin_path,
                group=f"outboxkit-bench-connect-{uuid.uuid4().hex[:8]}",
            )
        else:
            main = "org.apache.kafka.connect.cli.ConnectStandalone"
            text = worker_properties(
                bootstrap=self.bootstrap,
                rest_port=self.port,
                plugin_path=self.jars.plugin_path,
                offsets_file=self.base_dir / "offsets.dat",
            )
        props.write_text(text)
        argv = [
            java(),
            "-Xms256m",
            HEAP,
            "-XX:+UseG1GC",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={LOG4J2_CONFIG}",
            "-cp",
            f"{self.jars.runtime}/*",
            main,
            str(props),
        ]
        self.service = ServiceProcess(
            "kafka-connect-distributed" if self.distributed else "kafka-connect",
            argv,
            self.log_path,
            self._ready,
            start_timeout=timeout,
            owned_dir=self.base_dir,
        )
        try:
            self.service.start()
            plugins = self.request("GET", "/connector-plugins")
            classes = {p["class"] for p in plugins}
            if "io.debezium.connector.postgresql.PostgresConnector" not in classes:
                raise ConnectError(
                    f"Debezium's connector is not among the worker's plugins {sorted(classes)};"
                    f" log tail:\n{log_tail(self.log_path)}"
                )
        except BaseException:
            self.stop()
            raise
        return self

    def _ready(self) -> bool:
        return self.request("GET", "/").get("version") is not None

    def request(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            self.url + path,
            data=data,
            method=method,
            headers={"Content-Type": "application/json", "Accept": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:2000]
            raise ConnectError(f"{method} {path}: HTTP {exc.code}: {detail}") from None
        return json.loads(raw) if raw else None

    def create(self, config: dict[str, str], timeout: float = 90.0) -> None:
        """Create the connector and wait until it and its task are RUNNING."""
        name = config["name"]
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.request("PUT", f"/connectors/{name}/config", config)
                break
            except ConnectError as exc:
                # A distributed worker answers 409 while it joins its group or rebalances.
                if "HTTP 409" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        status: Any = None
        while time.monotonic() < deadline:
            try:
                status = self.request("GET", f"/connectors/{name}/status")
            except ConnectError:
                status = None  # 404 until the worker has started it
            if status is not None:
                states = [status["connector"]["state"]] + [t["state"] for t in status["tasks"]]
                if "FAILED" in states:
                    raise ConnectError(f"connector {name} failed: {json.dumps(status)[:3000]}")
                if status["tasks"] and all(s == "RUNNING" for s in states):
                    return
            time.sleep(0.2)
        raise ConnectError(
            f"connector {name} not running after {timeout:.0f}s: {status};"
            f" log tail:\n{log_tail(self.log_path)}"
        )

    def delete(self, name: str) -> None:
        self.request("DELETE", f"/connectors/{name}")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if name not in self.request("GET", "/connectors"):
                return
            time.sleep(0.2)
        raise ConnectError(f"connector {name} still listed 60s after DELETE")

    @property
    def pid(self) -> int | None:
        return self.service.pid if self.service else None

    def stop(self) -> None:
        if self.service is not None:
            self.service.stop(timeout=30)
        shutil.rmtree(self.base_dir, ignore_errors=True)

    def __enter__(self) -> ConnectWorker:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
