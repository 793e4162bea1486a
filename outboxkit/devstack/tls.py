"""A throwaway certificate authority and a broker certificate for the dev stack's TLS listener.

``openssl`` makes the keys and certificates (milliseconds, where each ``keytool`` call starts a
JVM); ``keytool`` makes only the PKCS12 truststore, because Java trusts a certificate in a PKCS12
file only with an attribute that this OpenSSL release cannot write. Passwords reach both tools
through the environment, never the command line (which every local user can read in ``/proc``).
The CA's private key is deleted once the broker certificate is signed: nothing else can ever be
issued under this CA, so trusting its certificate trusts this one broker only (and, if asked for
when the files are made, one client certificate, for a listener that requires client auth).
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from ipaddress import ip_address
from pathlib import Path

from outboxkit.errors import DevStackError

_PASSWORD_ENV = "OUTBOXKIT_TLS_STORE_PASSWORD"  # a variable name, not a secret
_CURVE = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"]


@dataclass(frozen=True)
class BrokerTls:
    """Files for the broker (PKCS12 keystore and truststore) and for clients (CA PEM)."""

    ca_pem: Path
    keystore: Path
    truststore: Path
    password: str = field(repr=False)  # of both stores and of the key in the keystore


@dataclass(frozen=True)
class ClientTls:
    """A client certificate (PEM) signed by the dev CA, its key unencrypted, and the same key
    encrypted (PKCS#8, AES-256) with ``key_password``, the form a production key often has."""

    certificate: Path
    key: Path
    encrypted_key: Path
    key_password: str = field(repr=False)


def client_tls(directory: Path, key_password: str) -> ClientTls:
    """Where :func:`make_broker_tls` puts the client files in ``directory``."""
    return ClientTls(
        certificate=directory / "client.pem",
        key=directory / "client.key",
        encrypted_key=directory / "client-encrypted.key",
        key_password=key_password,
    )


def _tool(name: str, java: str | None = None) -> str:
    if java is not None:
        sibling = Path(java).resolve().parent / name
        if sibling.exists():
            return str(sibling)
    found = shutil.which(name)
    if found is None:
        package = "openssl" if name == "openssl" else "openjdk-17-jre-headless"
        raise DevStackError(
            f"{name} is needed to make the dev stack's TLS certificates"
            f" (Debian: apt-get install {package})"
        )
    return found


def _run(cwd: Path, password: str, command: list[str], *more: list[str]) -> None:
    """``command`` is the tool and a fixed, space-separated argument string; ``more`` are
    argument lists holding values (paths, names), passed as they are."""
    argv = [command[0], *command[1].split(), *command[2:]]
    argv += [arg for part in more for arg in part]
    env = dict(os.environ)
    env[_PASSWORD_ENV] = password
    result = subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, check=False, timeout=120
    )
    if result.returncode != 0:
        raise DevStackError(
            f"making the dev stack's TLS files failed at `{Path(argv[0]).name} {argv[1]}`:\n"
            f"{result.stdout[-2000:]}\n{result.stderr[-2000:]}"
        )


def _make_ca(openssl: str, directory: Path, password: str, days: int, suffix: str) -> None:
    """``ca.key`` and ``ca.pem``: a CA of one dev server's own (``suffix`` keeps its subject
    apart from every other's, so a client never confuses two)."""
    _run(
        directory,
        password,
        [openssl, "req -x509 -new -nodes -keyout ca.key -out ca.pem", *_CURVE],
        ["-days", str(days), "-subj", f"/CN=outboxkit dev CA {suffix}"],
        ["-addext", "basicConstraints=critical,CA:TRUE"],
        ["-addext", "keyUsage=critical,keyCertSign,cRLSign"],
    )


def _san(hosts: Sequence[str]) -> str:
    names = []
    for host in hosts:
        try:
            ip_address(host)
            names.append(f"IP:{host}")
        except ValueError:
            names.append(f"DNS:{host}")
    return ",".join(names)


def make_broker_tls(
    directory: Path,
    password: str,
    *,
    java: str | None = None,
    hosts: Sequence[str] = ("127.0.0.1", "localhost"),
    days: int = 30,
    client: ClientTls | None = None,
) -> BrokerTls:
    """Create (once; later calls reuse them) the CA and broker files in ``directory``, and the
    ``client`` files too if given: they can be made only now, while the CA's key exists."""
    files = BrokerTls(
        ca_pem=directory / "ca.pem",
        keystore=directory / "broker.p12",
        truststore=directory / "truststore.p12",
        password=password,
    )
    done = directory / "complete"
    if done.exists():
        if client is not None and not client.certificate.exists():
            raise DevStackError(f"{directory} was made without a client certificate")
        return files
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    openssl = _tool("openssl")
    suffix = secrets.token_hex(4)  # distinct subjects: a client never confuses two dev CAs
    _make_ca(openssl, directory, password, days, suffix)
    _run(
        directory,
        password,
        [openssl, "req -new -nodes -keyout broker.key -out broker.csr", *_CURVE],
        ["-subj", f"/CN=outboxkit dev broker {suffix}"],
    )
    (directory / "broker.ext").write_text(
        f"subjectAltName={_san(hosts)}\n"
        "basicConstraints=critical,CA:FALSE\n"
        "keyUsage=critical,digitalSignature\n"
        "extendedKeyUsage=serverAuth\n"
        "subjectKeyIdentifier=hash\n"
        "authorityKeyIdentifier=keyid,issuer\n"
    )
    _run(
        directory,
        password,
        [openssl, "x509 -req -in broker.csr -CA ca.pem -CAkey ca.key -extfile broker.ext"],
        ["-set_serial", str(secrets.randbits(63)), "-days", str(days), "-out", "broker.pem"],
    )
    _run(
        directory,
        password,
        [openssl, "pkcs12 -export -in broker.pem -inkey broker.key -certfile ca.pem -name broker"],
        ["-out", files.keystore.name, "-passout", f"env:{_PASSWORD_ENV}"],
    )
    _run(
        directory,
        password,
        [_tool("keytool", java), "-importcert -noprompt -alias outboxkit-dev-ca -file ca.pem"],
        ["-keystore", files.truststore.name, "-storetype", "PKCS12"],
        ["-storepass:env", _PASSWORD_ENV],
    )
    if client is not None:
        _make_client(directory, client, openssl, suffix, days)
    for leftover in ("ca.key", "broker.key", "broker.csr", "broker.ext", "client.csr"):
        (directory / leftover).unlink(missing_ok=True)
    done.write_text("ok\n")
    return files


def _make_client(directory: Path, client: ClientTls, openssl: str, suffix: str, days: int) -> None:
    _run(
        directory,
        client.key_password,
        [openssl, "req -new -nodes -out client.csr", *_CURVE],
        ["-keyout", client.key.name, "-subj", f"/CN=outboxkit dev client {suffix}"],
    )
    (directory / "client.ext").write_text(
        "basicConstraints=critical,CA:FALSE\n"
        "keyUsage=critical,digitalSignature\n"
        "extendedKeyUsage=clientAuth\n"
    )
    _run(
        directory,
        client.key_password,
        [openssl, "x509 -req -in client.csr -CA ca.pem -CAkey ca.key -extfile client.ext"],
        ["-set_serial", str(secrets.randbits(63)), "-days", str(days)],
        ["-out", client.certificate.name],
    )
    _run(
        directory,
        client.key_password,
        [openssl, "pkcs8 -topk8 -v2 aes-256-cbc", "-passout", f"env:{_PASSWORD_ENV}"],
        ["-in", client.key.name, "-out", client.encrypted_key.name],
    )
    (directory / "client.ext").unlink()


@dataclass(frozen=True)
class ServerPem:
    """PEM files for a server that reads them itself (PostgreSQL): the CA, the server's
    certificate and key, and a client certificate and key whose CN is ``client_user``."""

    ca_pem: Path
    certificate: Path
    key: Path
    client_certificate: Path
    client_key: Path


def make_server_pem(
    directory: Path,
    client_user: str,
    *,
    hosts: Sequence[str] = ("127.0.0.1", "localhost"),
    days: int = 30,
) -> ServerPem:
    """Create (once) a CA, a server certificate for ``hosts`` and a client certificate for
    ``client_user`` in ``directory`` (keys 0600), then delete the CA's key, as above."""
    files = ServerPem(
        ca_pem=directory / "ca.pem",
        certificate=directory / "server.pem",
        key=directory / "server.key",
        client_certificate=directory / "client.pem",
        client_key=directory / "client.key",
    )
    if (directory / "complete").exists():
        return files
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    openssl = _tool("openssl")
    suffix = secrets.token_hex(4)
    unused = secrets.token_hex(8)  # _run's environment variable; no key here is encrypted
    _make_ca(openssl, directory, unused, days, suffix)
    signed = (
        ("server", f"/CN=outboxkit dev server {suffix}", f"subjectAltName={_san(hosts)}\n"),
        ("client", f"/CN={client_user}", "extendedKeyUsage=clientAuth\n"),
    )
    for name, subject, extensions in signed:
        _run(
            directory,
            unused,
            [openssl, f"req -new -nodes -keyout {name}.key -out {name}.csr", *_CURVE],
            ["-subj", subject],
        )
        (directory / f"{name}.ext").write_text(
            extensions + "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\n"
        )
        _run(
            directory,
            unused,
            [openssl, f"x509 -req -in {name}.csr -CA ca.pem -CAkey ca.key -extfile {name}.ext"],
            ["-set_serial", str(secrets.randbits(63)), "-days", str(days)],
            ["-out", f"{name}.pem"],
        )
        os.chmod(directory / f"{name}.key", 0o600)
        for leftover in (f"{name}.csr", f"{name}.ext"):
            (directory / leftover).unlink()
    (directory / "ca.key").unlink()
    (directory / "complete").write_text("ok\n")
    return files
