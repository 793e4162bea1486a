"""A throwaway PostgreSQL cluster: ``initdb`` into a temp directory, ``postgres`` on a free port."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg

from outboxkit.devstack.files import write_private
from outboxkit.devstack.process import (
    ManagedServer,
    ServiceProcess,
    _die_with_parent,
    chown_tree,
    free_port,
    service_user,
)
from outboxkit.devstack.registry import make_registered_dir
from outboxkit.devstack.tls import ServerPem, make_server_pem
from outboxkit.errors import DevStackError

_DEBIAN_BINDIRS = (
    "/usr/lib/postgresql/15/bin",
    "/usr/lib/postgresql/16/bin",
    "/usr/lib/postgresql/17/bin",
)


def find_bindir() -> Path:
    """Where ``initdb`` and ``postgres`` live: $OUTBOXKIT_PG_BINDIR, ``pg_config``, Debian paths."""
    explicit = os.environ.get("OUTBOXKIT_PG_BINDIR")
    candidates: list[str] = [explicit] if explicit else []
    pg_config = shutil.which("pg_config")
    if pg_config:
        out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, check=False)
        candidates.append(out.stdout.strip())
    candidates.extend(_DEBIAN_BINDIRS)
    for candidate in candidates:
        if candidate and (Path(candidate) / "postgres").exists():
            return Path(candidate)
    raise DevStackError(
        "PostgreSQL server binaries (initdb, postgres) not found; install them"
        " (Debian: apt-get install postgresql-15) or set OUTBOXKIT_PG_BINDIR"
    )


#: With ``tls=True``: TCP without TLS is refused, whatever the user; this user logs in with a
#: client certificate (CN = user name), every other one with a password.
CERT_USER = "outboxkit_cert"
_TLS_HBA = f"""# outboxkit dev stack, tls=True
local all all scram-sha-256
hostnossl all all 0.0.0.0/0 reject
hostnossl all all ::/0 reject
hostssl all {CERT_USER} 127.0.0.1/32 cert
hostssl all all 127.0.0.1/32 scram-sha-256
"""
#: Set in every URL of the server: it has no GSSAPI, and it is the one server to reach (a
#: ``PGHOSTADDR`` would replace the URL's host; a libpq service, ``PGSERVICE``, cannot be
#: overridden from a URL, and a wrong one is told by the start's error).
_PINNED = "hostaddr=127.0.0.1&gssencmode=disable&target_session_attrs=any"


class PostgresServer(ManagedServer):
    """One cluster. ``stop``/``kill``/``start`` keep the data, so tests can restart it.

    ``tls=True``: TLS with a certificate for 127.0.0.1/localhost signed by a CA made at first
    start (:attr:`tls_files`), TCP without TLS refused (see :data:`CERT_USER`), so a test can
    prove the product reaches a server that requires TLS from the URL alone."""

    log_name = "postgres.log"

    def __init__(
        self, base_dir: Path | None = None, *, durable: bool = False, tls: bool = False
    ) -> None:
        self._dir_token: str | None = None
        if base_dir is None:
            base_dir, self._dir_token = make_registered_dir("outboxkit-pg-")
        self.base_dir = Path(base_dir)
        self.data_dir = self.base_dir / "data"
        self.port = free_port()
        self.user = "outboxkit"
        self.password = secrets.token_urlsafe(18)
        self.durable = durable
        self.tls = tls
        self.bindir = find_bindir()
        self._os_user = service_user()
        self._service: ServiceProcess | None = None
        self._frozen: list[int] = []

    @property
    def url(self) -> str:
        """libpq URL of the maintenance database ``postgres``."""
        return self.url_for("postgres")

    @property
    def tls_files(self) -> ServerPem:
        """The CA (``ca_pem``) and the client certificate and key of :data:`CERT_USER`."""
        if not self.tls:
            raise DevStackError("this PostgresServer was made without tls=True")
        return make_server_pem(self.base_dir / "tls", CERT_USER)

    def url_for(self, database: str, *, sslmode: str | None = None) -> str:
        """Every URL names its ``sslmode`` (default ``disable``; with ``tls=True`` libpq's own
        default, ``prefer``) and :data:`_PINNED`, so the developer's ``PGSSLMODE``,
        ``PGGSSENCMODE`` or ``PGTARGETSESSIONATTRS`` cannot change how it is reached. With
        ``verify-ca``/``verify-full`` it names the dev CA too."""
        mode = sslmode or ("prefer" if self.tls else "disable")
        url = f"postgresql://{self.user}:{self.password}@127.0.0.1:{self.port}/{database}"
        url += f"?sslmode={mode}"
        if mode in ("verify-ca", "verify-full"):
            url += f"&sslrootcert={self.tls_files.ca_pem}"
        return f"{url}&{_PINNED}"

    def cert_url_for(self, database: str) -> str:
        """:data:`CERT_USER` with its client certificate, verifying the server (no password)."""
        files = self.tls_files
        return (
            f"postgresql://{CERT_USER}@127.0.0.1:{self.port}/{database}?sslmode=verify-full"
            f"&sslrootcert={files.ca_pem}&sslcert={files.client_certificate}"
            f"&sslkey={files.client_key}&{_PINNED}"
        )

    def _write_tls(self) -> dict[str, str]:
        """The server's copies of its key, certificate and the CA, owned by the server's OS
        user (PostgreSQL refuses a key others can read); the settings naming them."""
        files = self.tls_files
        for source, name in ((files.key, "server.key"), (files.certificate, "server.crt")):
            write_private(self.data_dir / name, source.read_text())
        write_private(self.data_dir / "root.crt", files.ca_pem.read_text())
        write_private(self.data_dir / "pg_hba.conf", _TLS_HBA)
        chown_tree(self.data_dir, self._os_user)
        return {
            "ssl": "on",
            "ssl_cert_file": "'server.crt'",
            "ssl_key_file": "'server.key'",
            "ssl_ca_file": "'root.crt'",
        }

    def _initdb(self) -> None:
        self.base_dir.mkdir(parents=True, exist_ok=True)
        pwfile = self.base_dir / "pwfile"
        write_private(pwfile, self.password + "\n")  # 0600 from the start; chowned below
        os.chmod(self.base_dir, 0o755)
        chown_tree(self.base_dir, self._os_user)
        try:
            result = subprocess.run(
                [
                    str(self.bindir / "initdb"),
                    "-D",
                    str(self.data_dir),
                    "-U",
                    self.user,
                    f"--pwfile={pwfile}",
                    "--auth=scram-sha-256",
                    "-E",
                    "UTF8",
                    "--locale=C.UTF-8",
                    "--no-sync",
                ],
                capture_output=True,
                text=True,
                user=self._os_user,
                check=False,
                preexec_fn=_die_with_parent,  # not left running by a SIGKILLed owner
            )
        finally:
            pwfile.unlink(missing_ok=True)
        if result.returncode != 0:
            raise DevStackError(f"initdb failed:\n{result.stdout}\n{result.stderr}")
        settings = {
            "listen_addresses": "'127.0.0.1'",
            "port": str(self.port),
            # TCP only: a socket path in a long TMPDIR passes the 107-byte limit, and
            # PostgreSQL would not start
            "unix_socket_directories": "''",
            "max_connections": "200",
            "wal_level": "logical",
            "max_replication_slots": "8",
            "max_wal_senders": "8",
            "shared_buffers": "256MB",
            "logging_collector": "off",
            "log_min_messages": "warning",
        }
        if not self.durable:
            settings |= {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}
        if self.tls:
            settings |= self._write_tls()
        with open(self.data_dir / "postgresql.conf", "a") as conf:
            conf.write("\n# outboxkit dev stack\n")
            for key, value in settings.items():
                conf.write(f"{key} = {value}\n")

    def freeze(self) -> None:
        """SIGSTOP the server and every process it started: it still accepts TCP connections
        and answers nothing on them, as a server behind a partition that sends no reset does
        (a fault for tests; :meth:`thaw` ends it). Each backend leaves the server's process
        group, so each is stopped by its own pid."""
        if self._service is None or self._service.pid is None:
            raise DevStackError("PostgreSQL is not running")
        postmaster = self._service.pid
        os.kill(postmaster, signal.SIGSTOP)  # first: no new backend from now on
        self._frozen = [postmaster, *_children(postmaster)]
        for pid in self._frozen[1:]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)

    def thaw(self) -> None:
        """Continue what :meth:`freeze` stopped."""
        frozen, self._frozen = self._frozen, []
        for pid in reversed(frozen):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    @contextlib.contextmanager
    def read_only(self) -> Iterator[None]:
        """The server keeps answering but takes no writes, as a replica does (a fault for
        tests): ``default_transaction_read_only`` for every session, the open ones included (a
        reload), until the block ends. Undone however the block ends, the set-up included."""
        try:
            with psycopg.connect(self._admin_url(), autocommit=True, connect_timeout=10) as conn:
                conn.execute("ALTER SYSTEM SET default_transaction_read_only = on")
                conn.execute("SELECT pg_reload_conf()")
            yield
        finally:
            with psycopg.connect(self._admin_url(), autocommit=True, connect_timeout=10) as conn:
                conn.execute("SET default_transaction_read_only = off")
                conn.execute("ALTER SYSTEM RESET default_transaction_read_only")
                conn.execute("SELECT pg_reload_conf()")

    def _admin_url(self) -> str:
        """The superuser's URL for the server's own checks (over TLS: verified)."""
        return self.url_for("postgres", sslmode="verify-full") if self.tls else self.url

    def _ready(self) -> bool:
        with psycopg.connect(self._admin_url(), connect_timeout=2) as conn:
            conn.execute("SELECT 1")
            if self.tls:  # the certificate's user: a member of the owner of every object
                conn.execute(
                    "DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles"
                    f" WHERE rolname = '{CERT_USER}') THEN CREATE ROLE {CERT_USER} LOGIN"
                    f" IN ROLE {self.user}; END IF; END $$"
                )
        return True

    def start(self) -> None:
        if not (self.data_dir / "PG_VERSION").exists():
            self._initdb()
        if self._service is None:
            self._service = ServiceProcess(
                "postgresql",
                [str(self.bindir / "postgres"), "-D", str(self.data_dir)],
                self.base_dir / "postgres.log",
                self._ready,
                user=self._os_user,
                start_timeout=60,
                stop_signal=2,  # SIGINT: "fast" shutdown
                secrets=(self.password,),
                owned_dir=self.base_dir,
                dir_token=self._dir_token,
            )
        self._service.start()


def _children(pid: int) -> list[int]:
    """The pids whose parent is ``pid`` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # ended meanwhile
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry.name))
    return found


def database_url_with(url: str, database: str) -> str:
    """The same server, credentials and options, another database (split where libpq splits:
    a '/' in the options, ``sslrootcert=/path``, is not the database's)."""
    return urlunsplit(urlsplit(url)._replace(path=f"/{database}"))


def sqlalchemy_url(url: str, *, driver: str = "psycopg") -> str:
    """libpq URL to the SQLAlchemy form (``postgresql+psycopg://``)."""
    scheme, _, rest = url.partition("://")
    if scheme in ("postgres", "postgresql"):
        return f"postgresql+{driver}://{rest}"
    return url
