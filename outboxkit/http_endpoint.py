"""The small HTTP endpoint a relay or a consumer serves (``/metrics``, the relay's
``/healthz``), hardened against the clients it cannot choose.

The standard library's threaded server gives every connection a thread and a file descriptor
for as long as the client keeps it, with no time limit and no cap, and a listen backlog of
five. A thousand idle connections (a slow or hostile client) then took the process's file
descriptors: the relay could open neither a database connection nor a Kafka socket, so it
stopped publishing, and a standby that took a shard over published nothing. Failed accepts
made the server spin a core. Here each read waits at most :data:`READ_SECONDS`, a connection
lives at most :data:`CONNECTION_SECONDS` (one reaper thread ends the late ones), at most
:data:`MAX_CONNECTIONS` are served at once (more are closed at once, unread), a failed accept
backs off, the backlog holds :data:`BACKLOG` scrapers arriving together, and a client that
goes away mid-answer is not a traceback on stderr (it broke ``--json-logs``).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from outboxkit.errors import unlistenable

logger = logging.getLogger("outboxkit.http")

#: A connection is ended this long after it was accepted, answered or not.
CONNECTION_SECONDS = 5.0
#: Each read of a request (its line, each header) waits at most this long.
READ_SECONDS = 2.0
#: Connections served at once; one more is closed at once.
MAX_CONNECTIONS = 32
#: Connections the kernel keeps waiting for an accept (many scrapers at once).
BACKLOG = 128
#: The pause after an accept that failed for want of descriptors or memory.
ACCEPT_BACKOFF_SECONDS = 0.1
_OUT_OF = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}

#: An answer: status, content type, body.
Answer = tuple[int, str, bytes]
#: A route is called with the request's ``Accept`` header (or ``None``).
Routes = Mapping[str, Callable[[str | None], Answer]]


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = BACKLOG

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler]) -> None:
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        # Live connections and when each is to end; the reaper's shutdown and our close of a
        # socket both hold the lock, so the reaper never touches a descriptor closed (and
        # perhaps reused) meanwhile.
        self.live: dict[socket.socket, float] = {}
        self.live_lock = threading.Lock()
        self.reaping = threading.Event()
        super().__init__(address, handler)

    def server_bind(self) -> None:
        if self.address_family == socket.AF_INET6:  # "::" takes IPv4 clients too
            with contextlib.suppress(OSError):
                self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()

    def get_request(self) -> tuple[socket.socket, Any]:
        try:
            return super().get_request()
        except OSError as exc:
            if exc.errno in _OUT_OF:  # the listener stays readable: without a pause, a spin
                time.sleep(ACCEPT_BACKOFF_SECONDS)
            raise

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):
            self.shutdown_request(request)  # full: closed unread, nothing more held
            return
        with self.live_lock:
            self.live[request] = time.monotonic() + CONNECTION_SECONDS
        try:
            super().process_request(request, client_address)  # its thread releases the slot
        except BaseException:
            self.slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()

    def shutdown_request(self, request: Any) -> None:
        with self.live_lock:
            self.live.pop(request, None)
            super().shutdown_request(request)

    def reap(self) -> None:
        """End the connections past their time (their threads' reads then return)."""
        while not self.reaping.wait(0.5):
            now = time.monotonic()
            with self.live_lock:
                for request, deadline in list(self.live.items()):
                    if deadline <= now:
                        del self.live[request]
                        with contextlib.suppress(OSError):
                            request.shutdown(socket.SHUT_RDWR)

    def server_close(self) -> None:
        self.reaping.set()
        super().server_close()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client gone or too slow is its own business; anything else is logged (through
        logging, so ``--json-logs`` stays one object per line)."""
        if isinstance(sys.exc_info()[1], OSError):  # reset, broken pipe, timed out, cut
            logger.debug("HTTP client %s went away", client_address, exc_info=True)
        else:
            logger.warning("answering HTTP client %s failed", client_address, exc_info=True)


def _handler(routes: Routes) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        timeout = READ_SECONDS

        def do_GET(self) -> None:
            self._answer(body=True)

        def do_HEAD(self) -> None:
            self._answer(body=False)

        def _answer(self, body: bool) -> None:
            route = routes.get(urlsplit(self.path).path)
            try:
                answer = route(self.headers.get("Accept")) if route else None
                status, content_type, data = answer or (404, "text/plain", b"not found\n")
            except Exception:
                logger.warning("answering %s failed", urlsplit(self.path).path, exc_info=True)
                status, content_type, data = 500, "text/plain", b"internal error\n"
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if body:
                self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            return

    return Handler


def serve(routes: Routes, host: str, port: int, section: str) -> ThreadingHTTPServer:
    """Serve ``routes`` (exact paths; a query string is ignored) on daemon threads, over IPv4
    or IPv6 as ``host`` resolves. An address that cannot be bound is a
    :class:`ConfigurationError` naming ``section``'s settings."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        kind: type[_Server] = type("Server", (_Server,), {"address_family": family})
        server = kind((host, port), _handler(routes))
    except (OSError, ValueError, TypeError) as exc:  # unresolvable, taken, privileged port
        raise unlistenable(host, port, exc, section) from None
    name = f"outboxkit-{section}-http"
    threading.Thread(target=server.serve_forever, name=name, daemon=True).start()
    threading.Thread(target=server.reap, name=f"{name}-reaper", daemon=True).start()
    return server


def scrape(registry: Any) -> Callable[[str | None], Answer]:
    """The ``/metrics`` route of a Prometheus ``registry``: the text format, or OpenMetrics
    when the scraper asks for it (as prometheus_client's own server answered)."""
    from prometheus_client.exposition import choose_encoder

    def answer(accept: str | None) -> Answer:
        encode, content_type = choose_encoder(accept or "")
        return (200, content_type, encode(registry))

    return answer
