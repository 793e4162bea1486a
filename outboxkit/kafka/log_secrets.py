"""Secret values taken out of the Kafka clients' own log lines.

librdkafka quotes some property values in its lines: an OAUTHBEARER/OIDC failure names the token
endpoint URL (with any credentials or token in it), and ``debug=conf`` lists the configuration
with only ``sasl.username``/``sasl.password``/``sasl.oauthbearer.client.secret`` redacted. aiokafka
at DEBUG logs each request, a SASL PLAIN login's bytes (user name and password) included. The
values of the SASL and key passwords, and of the ``[kafka] properties`` and consumer
``kafka_options`` whose names mark them as secrets (:func:`is_secret_name`), are replaced in those
lines by the name of their setting.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable

#: A value shorter than this is not looked for: it would be masked in lines where it is only a
#: word, while telling little.
MIN_MASKED = 6
#: Setting names whose values are secrets (librdkafka's and aiokafka's spellings): other values
#: (``debug=broker``, ``auto.offset.reset=earliest``) are ordinary words of the clients' lines.
_SECRET_NAME = re.compile(
    r"password|secret|token|jaas|extensions|oauthbearer[._]config|credential|key[._]pem",
    re.IGNORECASE,
)
# aiokafka's repr of a SASL request: the bytes hold "<authzid>\0<user>\0<password>" for PLAIN.
_SASL_BYTES_RE = re.compile(r"""(auth_bytes=)b(?:'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")""")


class SecretMask:
    """Values to replace, each by its setting's name in angle brackets, longest first (a value
    holding another is replaced whole). Thread-safe: clients log from their own threads."""

    def __init__(self, named: Iterable[tuple[str, str]] = ()) -> None:
        self._lock = threading.Lock()
        self._names: dict[str, str] = {}
        self._order: list[str] = []
        self.add(named)

    def add(self, named: Iterable[tuple[str, str]]) -> None:
        """``(setting name, value)`` pairs; a value's comma-separated items and the right side
        of their ``key=value`` are looked for too (``sasl.oauthbearer.extensions``)."""
        with self._lock:
            for name, value in named:
                for piece in _pieces(value):
                    self._names.setdefault(piece, f"<{name}>")
            self._order = sorted(self._names, key=len, reverse=True)

    def masked(self, text: str) -> str:
        text = _SASL_BYTES_RE.sub(r"\1b'***'", text)
        for value in self._order:
            if value in text:
                text = text.replace(value, self._names[value])
        return text


def _pieces(value: str) -> list[str]:
    found = [value]
    for item in value.split(","):
        found += [item.strip(), item.partition("=")[2].strip()]
    return [piece for piece in found if len(piece) >= MIN_MASKED]


def is_secret_name(name: str) -> bool:
    """Whether a setting called ``name`` holds a secret (a password, a client secret, a token
    endpoint URL that may carry credentials, a JAAS line)."""
    return bool(_SECRET_NAME.search(name))


__all__ = ["MIN_MASKED", "SecretMask", "is_secret_name"]
