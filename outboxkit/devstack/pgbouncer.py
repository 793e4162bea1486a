"""A PgBouncer in transaction-pooling mode in front of a PostgreSQL, for tests and demos.

Transaction pooling is how PgBouncer is most often run in production, and the mode that keeps
no session state: each transaction of a client may run on another server connection, so
session settings, LISTEN and (before PgBouncer 1.21) prepared statements do not follow a
client. The pool is kept smaller than the number of clients a test opens, so their
transactions really do share server connections.

The binary is found as PostgreSQL's are (``$OUTBOXKIT_PGBOUNCER``, ``PATH``, Debian's path), or
fetched once from Debian's package archive with ``apt-get download`` and unpacked into the
cache (``dpkg -x``: no root, nothing installed system-wide)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path
from urllib.parse import unquote, urlsplit

import psycopg

from outboxkit.devstack.files import cache_dir, make_owned_dir, write_private
from outboxkit.devstack.postgres import database_url_with
from outboxkit.devstack.process import (
    ManagedServer,
    ServiceProcess,
    chown_tree,
    free_port,
    service_user,
)
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
    return binary, {"LD_LIBRARY_PATH": str(root / "usr" / "lib" / "x86_64-linux-gnu")}


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
        self.base_dir, self._dir_token = make_owned_dir("outboxkit-pgbouncer-")
        self.port = free_port()
        self._os_user = service_user()  # PgBouncer refuses to run as root, as PostgreSQL does
        self._service: ServiceProcess | None = None

    def url_for(self, database: str) -> str:
        """The server URL's credentials and options, for ``database``, through the pooler."""
        parts = urlsplit(database_url_with(self._server_url, database))
        credentials = parts.netloc.rpartition("@")[0]
        return parts._replace(netloc=f"{credentials}@127.0.0.1:{self.port}").geturl()

    def _write_config(self) -> Path:
        users = self.base_dir / "users.txt"
        quoted = self._password.replace('"', '""')
        write_private(users, f'"{self._user}" "{quoted}"\n')  # PgBouncer's own file format
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
            config = self._write_config()
            self._service = ServiceProcess(
                "pgbouncer",
                [str(binary), str(config)],
                self.base_dir / self.log_name,
                self._ready,
                env={**os.environ, **env},
                user=self._os_user,
                start_timeout=30,
                stop_signal=signal.SIGTERM,  # immediate shutdown: clients are cut off
                owned_dir=self.base_dir,
                dir_token=self._dir_token,
            )
        self._service.start()
