"""A PgBouncer in transaction-pooling mode in front of a PostgreSQL, for tests and demos.

Transaction pooling is how PgBouncer is most often run in production, and the mode that keeps
no session state: each transaction of a client may run on another server connection, so
session settings, LISTEN and prepared statements do not follow a client (PgBouncer keeps
prepared statements from 1.21 on when ``max_prepared_statements`` is above 0: here it is 0, as
before 1.21). The pool is kept smaller than the number of clients a test opens, so their
transactions really do share server connections.

The binary is found as PostgreSQL's are (``$OUTBOXKIT_PGBOUNCER``, ``PATH``, Debian's path), or
fetched once from Debian's package archive with ``apt-get download`` and unpacked into the
cache (``dpkg -x``: no root, nothing installed system-wide). Run as another user (as root), the
server gets a copy of its own."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path
from urllib.parse import unquote, urlsplit

import psycopg

from outboxkit.devstack.files import cache_dir, write_private
from outboxkit.devstack.postgres import database_url_with
from outboxkit.devstack.process import (
    ManagedServer,
    ServiceProcess,
    chown_tree,
    free_port,
    service_user,
)
from outboxkit.devstack.registry import make_registered_dir
from outboxkit.errors import DevStackError

BINARY_ENV = "OUTBOXKIT_PGBOUNCER"
# Debian 12's PgBouncer (1.18: no prepared statements across a transaction pool) and the one
# library it needs that a PostgreSQL server install does not bring.
_PACKAGES = ("pgbouncer", "libc-ares2")
_UNPACKED = "pgbouncer-deb"


def find_pgbouncer() -> tuple[Path, dict[str, str]]:
    """The ``pgbouncer`` binary and the environment it runs with (a library path when it was
    unpacked from Debian's packages)."""
    explicit = os.environ.get(BINARY_ENV)
    if explicit:
        return Path(explicit), {}
    found = shutil.which("pgbouncer") or (
        "/usr/sbin/pgbouncer" if os.path.exists("/usr/sbin/pgbouncer") else None
    )
    if found:
        return Path(found), {}
    root = cache_dir() / _UNPACKED
    binary = root / "usr" / "sbin" / "pgbouncer"
    if not binary.exists():
        _unpack_debian_packages(root)
    libraries = ":".join(str(p) for p in sorted((root / "usr" / "lib").glob("*-linux-gnu")))
    return binary, {"LD_LIBRARY_PATH": libraries} if libraries else {}


def _version(binary: Path, env: dict[str, str]) -> tuple[int, int]:
    """``(major, minor)`` from ``pgbouncer --version`` ("PgBouncer 1.18.0")."""
    shown = subprocess.run(
        [str(binary), "--version"], env={**os.environ, **env}, capture_output=True, text=True
    )
    found = re.search(r"PgBouncer (\d+)\.(\d+)", shown.stdout)
    if found is None:
        raise DevStackError(f"{binary} --version said {shown.stdout!r} {shown.stderr!r}")
    return int(found[1]), int(found[2])


def _private_copy(binary: Path, env: dict[str, str], into: Path) -> tuple[Path, dict[str, str]]:
    """The binary and its unpacked libraries copied into ``into``: run as another user (as
    root), it cannot reach them in root's own cache."""
    copied = into / "bin" / binary.name
    copied.parent.mkdir()
    shutil.copy2(binary, copied)
    libraries = into / "lib"
    libraries.mkdir()
    for folder in filter(None, env.get("LD_LIBRARY_PATH", "").split(":")):
        for library in Path(folder).glob("*.so*"):
            shutil.copy2(library, libraries / library.name, follow_symlinks=True)
    return copied, {"LD_LIBRARY_PATH": str(libraries)}


def _unpack_debian_packages(root: Path) -> None:
    if shutil.which("apt-get") is None or shutil.which("dpkg") is None:
        raise DevStackError(
            "pgbouncer not found; install it (Debian: apt-get install pgbouncer) or set"
            f" {BINARY_ENV} to its path"
        )
    with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
        fetched = _download(tmp)
        if fetched.returncode != 0 and os.geteuid() == 0:  # package lists gone stale: refresh
            subprocess.run(["apt-get", "update", "-qq"], capture_output=True)
            fetched = _download(tmp)
        debs = sorted(Path(tmp).glob("*.deb"))
        if fetched.returncode != 0 or len(debs) != len(_PACKAGES):
            raise DevStackError(f"apt-get download {' '.join(_PACKAGES)} failed:\n{fetched.stderr}")
        staging = Path(tmp) / "root"
        for deb in debs:
            subprocess.run(["dpkg", "-x", str(deb), str(staging)], check=True)
        try:
            os.replace(staging, root)  # whole or not at all: a second process finds it complete
        except OSError:
            if not (root / "usr" / "sbin" / "pgbouncer").exists():
                raise
            # another process unpacked it first


def _download(into: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["apt-get", "download", *_PACKAGES], cwd=into, capture_output=True, text=True
    )


class PgBouncer(ManagedServer):
    """PgBouncer for every database of the server ``server_url`` names, with its credentials.

    :meth:`url_for` gives a client URL through the pooler. ``pool_size`` server connections per
    database and user (2 by default: fewer than the connections a relay or a consumer opens)."""

    log_name = "pgbouncer.log"
    stop_timeout = 10.0

    def __init__(self, server_url: str, *, pool_size: int = 2) -> None:
        parts = urlsplit(server_url)
        if parts.hostname is None or parts.port is None or parts.username is None:
            raise DevStackError("PgBouncer needs a server URL with a host, a port and a user")
        self._server_url = server_url
        self._server = (parts.hostname, parts.port)
        self._user = unquote(parts.username)
        self._password = unquote(parts.password or "")
        self.pool_size = pool_size
        self.base_dir, self._dir_token = make_registered_dir("outboxkit-pgbouncer-")
        self.port = free_port()
        self._os_user = service_user()  # PgBouncer refuses to run as root, as PostgreSQL does
        self._service: ServiceProcess | None = None

    def url_for(self, database: str) -> str:
        """The server URL's credentials and options, for ``database``, through the pooler."""
        parts = urlsplit(database_url_with(self._server_url, database))
        credentials = parts.netloc.rpartition("@")[0]
        return parts._replace(netloc=f"{credentials}@127.0.0.1:{self.port}").geturl()

    def _write_config(self, version: tuple[int, int]) -> Path:
        users = self.base_dir / "users.txt"
        user, password = (text.replace('"', '""') for text in (self._user, self._password))
        write_private(users, f'"{user}" "{password}"\n')  # PgBouncer's own file format
        config = self.base_dir / "pgbouncer.ini"
        host, port = self._server
        config.write_text(
            "[databases]\n"
            f"* = host={host} port={port}\n"
            "[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {self.port}\n"
            f"unix_socket_dir = {self.base_dir}\n"
            f"auth_type = scram-sha-256\nauth_file = {users}\n"
            "pool_mode = transaction\n"
            f"default_pool_size = {self.pool_size}\nmin_pool_size = 0\nreserve_pool_size = 0\n"
            "max_client_conn = 1000\n"
            # 1.21 and later can keep prepared statements (on by default from 1.24): off, as
            # in the PgBouncers this stands for
            + ("max_prepared_statements = 0\n" if version >= (1, 21) else "")
        )
        chown_tree(self.base_dir, self._os_user)
        return config

    def _ready(self) -> bool:
        with psycopg.connect(self.url_for("postgres"), connect_timeout=2) as conn:
            conn.execute("SELECT 1")
        return True

    def start(self) -> None:
        if self._service is None:
            binary, env = find_pgbouncer()
            version = _version(binary, env)
            if self._os_user is not None and cache_dir() in binary.parents:  # root's own
                binary, env = _private_copy(binary, env, self.base_dir)
            config = self._write_config(version)
            self._service = ServiceProcess(
                "pgbouncer",
                [str(binary), str(config)],
                self.base_dir / self.log_name,
                self._ready,
                env={**os.environ, **env},
                user=self._os_user,
                start_timeout=30,
                # immediate shutdown, clients cut off (SIGTERM waits for them from 1.23 on)
                stop_signal=signal.SIGQUIT if version >= (1, 23) else signal.SIGTERM,
                owned_dir=self.base_dir,
                dir_token=self._dir_token,
                secrets=(self._password,),
            )
        self._service.start()
