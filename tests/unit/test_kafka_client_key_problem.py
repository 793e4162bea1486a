"""A client certificate and key that do not load are explained by what is wrong with them: the
certificate before the key, a key of another certificate, a key's password missing or wrong.
Neither OpenSSL caller says so itself (confluent-kafka names a property, Python's ssl says
"PEM lib"). Real files made by openssl; nothing of them reaches a message."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from pydantic import SecretStr

from outboxkit.errors import ConfigurationError
from outboxkit.kafka.config import client_key_problem, ssl_context
from outboxkit.settings import KafkaSettings, SecurityProtocol

pytestmark = pytest.mark.unit

PASSWORD = "not-shown-0451"
CERT_PROBLEM = "OUTBOXKIT_KAFKA_SSL_CERTIFICATE_LOCATION is not a readable PEM certificate"
NO_PASSWORD = "the client key is encrypted and OUTBOXKIT_KAFKA_SSL_KEY_PASSWORD is not set"
WRONG_PASSWORD = "cannot be decrypted with OUTBOXKIT_KAFKA_SSL_KEY_PASSWORD (a wrong password?)"
MISMATCH = "the client key is not the key of OUTBOXKIT_KAFKA_SSL_CERTIFICATE_LOCATION"


def _openssl(directory: Path, *args: str) -> None:
    subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("openssl") is None:
        pytest.skip("openssl not installed")
    here = tmp_path_factory.mktemp("client-tls")
    for name in ("a", "b"):
        _openssl(here, "req", "-x509", "-new", "-nodes", "-newkey", "ec", "-pkeyopt",
                 "ec_paramgen_curve:prime256v1", "-keyout", f"{name}.key", "-out",
                 f"{name}.pem", "-days", "1", "-subj", f"/CN={name}")  # fmt: skip
    _openssl(here, "pkcs8", "-topk8", "-in", "a.key", "-out", "a-encrypted.key", "-passout",
             f"pass:{PASSWORD}")  # fmt: skip
    return here


def _context(files: Path, cert: str, key: str, password: str | None = None) -> str:
    settings = KafkaSettings(
        bootstrap="127.0.0.1:1",
        security_protocol=SecurityProtocol.SSL,
        ssl_certificate_location=files / cert,
        ssl_key_location=files / key,
        ssl_key_password=SecretStr(password) if password is not None else None,
    )
    with pytest.raises(ConfigurationError) as caught:
        ssl_context(settings)
    text = str(caught.value)
    assert PASSWORD not in text
    assert "PRIVATE KEY" not in text
    return text


def test_a_certificate_path_that_is_no_certificate_is_named_not_the_password(
    files: Path,
) -> None:
    assert CERT_PROBLEM in _context(files, "a-encrypted.key", "a-encrypted.key", PASSWORD)
    missing = client_key_problem(files / "nowhere.pem", files / "a-encrypted.key", False)
    assert missing.startswith(CERT_PROBLEM)


def test_a_key_of_another_certificate_is_named(files: Path) -> None:
    assert MISMATCH in _context(files, "a.pem", "b.key")


def test_an_encrypted_key_without_or_with_a_wrong_password(files: Path) -> None:
    assert NO_PASSWORD in _context(files, "a.pem", "a-encrypted.key")
    assert WRONG_PASSWORD in _context(files, "a.pem", "a-encrypted.key", "wrong")


def test_an_encrypted_key_after_a_long_chain_in_the_certificate_file(files: Path) -> None:
    bundle = files / "bundle.pem"
    chain = (files / "a.pem").read_bytes() * 8  # well past a first few kilobytes
    bundle.write_bytes(chain + (files / "a-encrypted.key").read_bytes())
    assert client_key_problem(bundle, None, False) == NO_PASSWORD


def test_a_key_path_that_is_a_pipe_is_not_read(files: Path) -> None:
    pipe = files / "key.fifo"
    os.mkfifo(pipe)
    problem = client_key_problem(files / "a.pem", pipe, False)  # would block if it were read
    assert problem.startswith("the client key cannot be loaded")


def test_the_confluent_refusal_names_the_certificate_when_the_certificate_is_wrong(
    files: Path,
) -> None:
    from outboxkit.kafka.config import refused_configuration

    conf = {
        "ssl.certificate.location": str(files / "nowhere.pem"),
        "ssl.key.location": str(files / "a-encrypted.key"),
    }
    text = "ssl.certificate.location failed: error:80000002:system library::No such file"
    error = refused_configuration("the producer", "_INVALID_ARG", text, conf, "hint")
    assert CERT_PROBLEM in str(error)
    assert NO_PASSWORD not in str(error)


def test_a_password_too_long_for_python_ssl_is_a_configuration_error(files: Path) -> None:
    too_long = "x" * 1025
    text = _context(files, "a.pem", "a-encrypted.key", too_long)
    assert "longer than the 1,024 bytes" in text
    assert too_long not in text


def test_another_value_error_names_its_class_only(files: Path) -> None:
    text = _context(files, "a\x00b.pem", "a-encrypted.key", PASSWORD)
    assert "ValueError (its text is not shown)" in text
