"""The dev stack's ``PostgresServer(tls=True)``: TLS on with a certificate from its own CA, TCP
without TLS refused, one user logging in by client certificate; without it, nothing changes."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from outboxkit.devstack import PostgresServer
from outboxkit.devstack import postgres as postgres_module
from outboxkit.devstack.postgres import database_url_with
from outboxkit.errors import DevStackError

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def _no_binaries_needed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(postgres_module, "find_bindir", lambda: tmp_path)


def test_without_it_the_urls_are_as_before_but_for_the_pinned_settings(tmp_path: Path) -> None:
    server = PostgresServer(tmp_path / "pg")
    assert server.url_for("db") == (
        f"postgresql://outboxkit:{server.password}@127.0.0.1:{server.port}/db"
        "?sslmode=disable&hostaddr=127.0.0.1&gssencmode=disable&target_session_attrs=any"
    )
    with pytest.raises(DevStackError, match="without tls=True"):
        server.tls_files  # noqa: B018


def test_the_config_refuses_tcp_without_tls(tmp_path: Path) -> None:
    server = PostgresServer(tmp_path / "pg", tls=True)
    server.data_dir.mkdir(parents=True)
    settings = server._write_tls()
    assert settings["ssl"] == "on"
    hba = [
        line.split()
        for line in (server.data_dir / "pg_hba.conf").read_text().splitlines()
        if line and not line.startswith("#")
    ]
    assert ["hostnossl", "all", "all", "0.0.0.0/0", "reject"] in hba
    assert ["hostssl", "all", postgres_module.CERT_USER, "127.0.0.1/32", "cert"] in hba
    assert ["hostssl", "all", "all", "127.0.0.1/32", "scram-sha-256"] in hba
    assert not [entry for entry in hba if entry[0] == "host"]  # TLS or nothing
    for name in ("server.key", "server.crt", "root.crt"):
        assert (server.data_dir / name).exists()
        assert stat.S_IMODE((server.data_dir / name).stat().st_mode) == 0o600
    assert stat.S_IMODE(server.tls_files.client_key.stat().st_mode) == 0o600


def test_the_urls_name_the_ca_and_the_client_certificate(tmp_path: Path) -> None:
    server = PostgresServer(tmp_path / "pg", tls=True)
    files = server.tls_files
    pinned = "&hostaddr=127.0.0.1&gssencmode=disable&target_session_attrs=any"
    assert server.url_for("db", sslmode="verify-full").endswith(
        f"/db?sslmode=verify-full&sslrootcert={files.ca_pem}{pinned}"
    )
    assert server.url_for("db", sslmode="disable").endswith(f"/db?sslmode=disable{pinned}")
    assert server.url_for("db").endswith(f"/db?sslmode=prefer{pinned}")
    cert_url = server.cert_url_for("db")
    assert server.password not in cert_url
    assert f"sslcert={files.client_certificate}&sslkey={files.client_key}" in cert_url
    assert f"sslrootcert={files.ca_pem}" in cert_url
    assert cert_url.endswith(pinned)


def test_another_database_keeps_options_holding_a_path() -> None:
    """Split where libpq splits: before, the '/' of ``sslrootcert=/path`` was taken for the one
    before the database name, and the per-test URL lost its options."""
    url = "postgresql://u:p@127.0.0.1:5/postgres?sslmode=verify-full&sslrootcert=/tmp/x/ca.pem"
    assert database_url_with(url, "db2") == (
        "postgresql://u:p@127.0.0.1:5/db2?sslmode=verify-full&sslrootcert=/tmp/x/ca.pem"
    )
    assert database_url_with("postgresql://u@h/postgres", "db2") == "postgresql://u@h/db2"
