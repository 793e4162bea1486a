"""The Apache Kafka broker's jars, fetched from Maven Central with ``mvn`` once into the cache
directory and reused afterwards. Processes starting at once (xdist workers, two demos) take turns
under a lock: one fetches, the others then find the jars complete."""

from __future__ import annotations

import contextlib
import fcntl
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from outboxkit.devstack.files import cache_dir
from outboxkit.errors import DevStackError

KAFKA_VERSION = "4.1.1"
_LOG4J_VERSION = "2.24.3"
_SLF4J_VERSION = "2.0.17"

_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>io.outboxkit.devstack</groupId><artifactId>kafka-runtime</artifactId>
  <version>1</version><packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId>
      <version>{kafka}</version></dependency>
    <dependency><groupId>org.slf4j</groupId><artifactId>slf4j-api</artifactId>
      <version>{slf4j}</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-slf4j2-impl</artifactId>
      <version>{log4j}</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-core</artifactId>
      <version>{log4j}</version></dependency>
  </dependencies>
</project>
"""


def maven_copy_dependencies(mvn: str, pom: Path, output: Path, *extra: str, what: str) -> None:
    """``mvn dependency:copy-dependencies`` of ``pom`` into ``output`` (runtime scope)."""
    argv = [mvn, "-B", "-q", "-f", str(pom), "dependency:copy-dependencies"]
    argv += [f"-DoutputDirectory={output}", "-DincludeScope=runtime", *extra]
    result = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=900)
    if result.returncode != 0:
        raise DevStackError(
            f"fetching {what} with Maven failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        )


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Holds an exclusive ``flock`` on ``path``; the kernel drops it if the process dies."""
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def kafka_libs(version: str = KAFKA_VERSION) -> Path:
    """The directory holding the broker's jars, fetched with Maven on first use.

    The fetch and the swap into ``libs`` run under a lock: without it a second process could
    delete the jars a first one's JVM was starting from."""
    target = cache_dir() / f"kafka-{version}"
    libs = target / "libs"
    marker = target / "complete"
    if marker.exists():
        return libs
    target.mkdir(parents=True, exist_ok=True)
    with _locked(target.parent / f"kafka-{version}.lock"):
        if not marker.exists():  # another process may have installed it while we waited
            _fetch(version, libs)
            marker.write_text(version)
    return libs


def _fetch(version: str, libs: Path) -> None:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise DevStackError(
            "Apache Kafka jars are not cached and Maven (mvn) is not installed;"
            " install Maven (Debian: apt-get install maven) or set OUTBOXKIT_KAFKA_BOOTSTRAP"
        )
    with tempfile.TemporaryDirectory(prefix="outboxkit-mvn-") as work:
        pom = Path(work) / "pom.xml"
        pom.write_text(_POM.format(kafka=version, slf4j=_SLF4J_VERSION, log4j=_LOG4J_VERSION))
        staging = Path(work) / "libs"
        maven_copy_dependencies(mvn, pom, staging, what=f"Kafka {version}")
        shutil.rmtree(libs, ignore_errors=True)
        shutil.move(str(staging), str(libs))
