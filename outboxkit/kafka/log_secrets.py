"""Secret values taken out of the Kafka clients' own log lines.

librdkafka quotes some property values in its lines: an OAUTHBEARER/OIDC failure names the token
endpoint URL (with any credentials or token in it), and ``debug=conf`` lists the configuration
with only ``sasl.username``/``sasl.password``/``sasl.oauthbearer.client.secret`` redacted. aiokafka
at DEBUG logs each request, a SASL PLAIN login's bytes (user name and password) included. The
values outboxkit counts as secrets (the SASL and key passwords, every ``[kafka] properties`` value
and a consumer's ``kafka_options``) are replaced in those lines by the name of their setting.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable

#: A value shorter than this (or a number) is not looked for: ``true`` or ``all`` would be masked
#: in every line that says them, while telling nothing.
MIN_MASKED = 6
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
    return [piece for piece in found if len(piece) >= MIN_MASKED and not _number(piece)]


def _number(text: str) -> bool:
    """A number is no secret, and masking one (``300000``) would garble every line holding it."""
    try:
        float(text)
    except ValueError:
        return False
    return True


__all__ = ["MIN_MASKED", "SecretMask"]
