"""A broker that requires a client certificate, as an aiokafka client without one meets it.

Under TLS 1.3 the broker's alert ("bad certificate", "certificate required") arrives after the
client's handshake completed: aiokafka sees the connection closed on its first request, logs
that with the TLS alert as the error's cause (``Unable connect to "host:port":
KafkaConnectionError: Connection at host:port closed``), then raises only ``Unable to bootstrap
from [...]``. So our clients watch aiokafka's log records while they connect (a context variable
scopes the watch to one call, and to the tasks it starts) and, when they use TLS without a
client certificate and the broker answered with such an alert, their error names the settings to
set. A broker that is away, a server certificate our CA does not sign, a listener expecting SASL:
none of them answers with a certificate alert, so none gets the hint. (The watch sees what the
``aiokafka`` logger lets through: raised above ERROR, that logger hides the alert from it too.)
"""

from __future__ import annotations

import contextlib
import logging
import ssl
from contextvars import ContextVar, Token
from types import TracebackType

from outboxkit.kafka.config import CLIENT_CERTIFICATE_HINT
from outboxkit.settings import KafkaSettings

# The alerts a TLS server sends a client whose certificate is missing or not trusted, as
# OpenSSL words them ("[SSL: SSLV3_ALERT_BAD_CERTIFICATE] sslv3 alert bad certificate").
_CERTIFICATE_ALERTS = (
    "alert bad certificate",
    "alert certificate required",
    "alert certificate unknown",
)


def certificate_alert(exc: BaseException) -> bool:
    """``exc`` or what caused it is a TLS alert from the server about the client certificate
    (aiokafka's closed connection carries it as ``__cause__``)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ssl.SSLError):
            text = str(current).lower()
            if any(alert in text for alert in _CERTIFICATE_ALERTS):
                return True
        current = current.__cause__ or current.__context__
    return False


def needs_certificate_hint(settings: KafkaSettings, errors: list[BaseException]) -> bool:
    """The pure decision: TLS without a client certificate, and a connection the broker ended
    with a certificate alert. With a certificate configured the operator has set what the hint
    names; without TLS no certificate is sent at all."""
    if not settings.uses_tls or settings.ssl_certificate_location is not None:
        return False
    return any(certificate_alert(exc) for exc in errors)


class CertificateWatch:
    """``with CertificateWatch(settings) as watch:`` around a client call, then
    ``watch.explained(text)`` for its error. Records whether aiokafka logged a connection ended
    by a certificate alert meanwhile (a flag, not the error: nothing is kept alive)."""

    __slots__ = ("_settings", "_token", "alerted")

    def __init__(self, settings: KafkaSettings) -> None:
        self._settings = settings
        self._token: Token[CertificateWatch | None] | None = None
        self.alerted = False

    def note(self, exc: BaseException) -> None:
        if not self.alerted and needs_certificate_hint(self._settings, [exc]):
            self.alerted = True

    def explained(self, text: str) -> str:
        """``text``, naming the client-certificate settings when the broker asked for one."""
        if not self.alerted or CLIENT_CERTIFICATE_HINT in text:
            return text
        return f"{text} ({CLIENT_CERTIFICATE_HINT})"

    def __enter__(self) -> CertificateWatch:
        self._token = _watching.set(self)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        token, self._token = self._token, None
        if token is not None:
            _watching.reset(token)


_watching: ContextVar[CertificateWatch | None] = ContextVar(
    "outboxkit_aiokafka_certificate_watch", default=None
)


class _ConnectionErrors(logging.Filter):
    """Hands the errors of aiokafka's connection lines to the watch of the call they belong to
    (the logged line itself is left as it is)."""

    def filter(self, record: logging.LogRecord) -> bool:
        watch = _watching.get()
        if watch is not None and isinstance(record.args, tuple):
            # An error whose str() fails is not the alert, and must not stop aiokafka's line.
            with contextlib.suppress(Exception):
                for arg in record.args:
                    if isinstance(arg, BaseException):
                        watch.note(arg)
        return True


# aiokafka.client logs each failed bootstrap or node connection here, with the error as an arg.
# First among the logger's filters: the credentials hint (``config``) rewrites a line naming the
# alert (TLS 1.2 logs the SSLError itself) into text without its args.
logging.getLogger("aiokafka").filters.insert(0, _ConnectionErrors())
