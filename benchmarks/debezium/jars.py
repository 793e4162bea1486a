"""Kafka Connect and the Debezium PostgreSQL connector, fetched once from Maven Central.

Two directories, as a Connect installation has them: the worker's classpath (``connect-runtime``
and its dependencies, at the broker's version) and a plugin directory holding Debezium with its
own dependencies (Kafka's and SLF4J's jars left out: the worker provides them). Both are cached
under ``~/.cache/outboxkit/debezium-<version>/`` with a marker file, like the broker's jars.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from outboxkit.devstack import KAFKA_VERSION
from outboxkit.devstack.files import cache_dir
from outboxkit.devstack.kafka import maven_copy_dependencies
from outboxkit.errors import DevStackError

HERE = Path(__file__).resolve().parent
DEBEZIUM_VERSION = "3.6.1.Final"
PLUGIN_NAME = "debezium-connector-postgres"


class FetchError(RuntimeError):
    """Maven could not resolve the jars (the message carries its output)."""


@dataclass(frozen=True)
class ConnectJars:
    runtime: Path  # the worker's classpath directory
    plugin_path: Path  # Connect's plugin.path: one sub-directory per plugin
    kafka_version: str
    debezium_version: str


def _mvn(pom: Path, output: Path, *extra: str) -> None:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise FetchError("Maven (mvn) is not installed; Debian: apt-get install maven")
    try:
        maven_copy_dependencies(mvn, pom, output, *extra, what=pom.name)
    except DevStackError as exc:
        raise FetchError(str(exc)) from exc


def _fetch_into(target: Path, marker: Path, pom: Path, marker_text: str, *extra: str) -> Path:
    """Copy the pom's runtime dependencies into ``target`` unless its marker says it is done."""
    if marker.exists() and marker.read_text() == marker_text and target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="outboxkit-mvn-") as work:
        staging = Path(work) / "jars"
        _mvn(pom, staging, *extra)
        shutil.rmtree(target, ignore_errors=True)
        shutil.move(str(staging), str(target))
    marker.write_text(marker_text)
    return target


def connect_jars(
    kafka_version: str = KAFKA_VERSION, debezium_version: str = DEBEZIUM_VERSION
) -> ConnectJars:
    """The cached jars, fetched with Maven on first use."""
    root = cache_dir() / f"debezium-{debezium_version}"
    runtime = _fetch_into(
        root / f"connect-runtime-{kafka_version}",
        root / f"connect-runtime-{kafka_version}.complete",
        HERE / "pom-connect.xml",
        kafka_version,
        f"-Dkafka.version={kafka_version}",
    )
    plugins = root / "plugins"
    _fetch_into(
        plugins / PLUGIN_NAME,
        root / f"{PLUGIN_NAME}.complete",
        HERE / "pom-debezium.xml",
        debezium_version,
        f"-Ddebezium.version={debezium_version}",
        "-DexcludeGroupIds=org.apache.kafka,org.slf4j",
    )
    return ConnectJars(runtime, plugins, kafka_version, debezium_version)


if __name__ == "__main__":
    jars = connect_jars()
    print(f"Kafka Connect {jars.kafka_version}: {jars.runtime}")
    print(f"Debezium {jars.debezium_version}: {jars.plugin_path / PLUGIN_NAME}")
