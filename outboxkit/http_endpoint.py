"""The small HTTP endpoint a relay or a consumer serves (``/metrics``, the relay's
``/healthz``), hardened against the clients it cannot choose.

The standard library's threaded server gives every connection a thread and a file descriptor
for as long as the client keeps it, with no time limit and no cap, and a listen backlog of
five. A thousand idle connections (a slow or hostile client) then took the process's file
descriptors: the relay could open neither a database connection nor a Kafka socket, so it
stopped publishing, and a standby that took a shard over published nothing. Failed accepts
made the server spin a core. Here a connection lives at most :data:`CONNECTION_SECONDS`, at most
:data:`MAX_CONNECTIONS` are served at once (more are closed at once, unread), a failed accept
backs off, the backlog holds :data:`BACKLOG` scrapers arriving together, and a client that goes
away mid-answer is not a traceback on stderr (it broke ``--json-logs``).
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

#: A connection is closed this long after it was accepted, answered or not.
CONNECTION_SECONDS = 10.0
#: Connections served at once; one more is closed at once.
MAX_CONNECTIONS = 32
#: Connections the kernel keeps waiting for an accept (many scrapers at once).
BACKLOG = 128
#: The pause after an accept that failed for want of descriptors or memory.
ACCEPT_BACKOFF_SECONDS = 0.1
_OUT_OF = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}

#: An answer: status, content type, body.
Answer = tuple[int, str, bytes]
Routes = Mapping[str, Callable[[], Answer]]


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = BACKLOG

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler]) -> None:
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        super().__init__(address, handler)

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
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        timer = threading.Timer(CONNECTION_SECONDS, _cut, (request,))
        timer.daemon = True
        timer.start()
        try:
            super().process_request_thread(request, client_address)
        finally:
            timer.cancel()
            self.slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client gone or too slow is its own business; anything else is logged (through
        logging, so ``--json-logs`` stays one object per line)."""
        if isinstance(sys.exc_info()[1], OSError):  # reset, broken pipe, timed out, cut
            logger.debug("HTTP client %s went away", client_address, exc_info=True)
        else:
            logger.warning("answering HTTP client %s failed", client_address, exc_info=True)


def _cut(request: socket.socket) -> None:
    """End a connection that outlived :data:`CONNECTION_SECONDS` (its thread's read returns)."""
    with contextlib.suppress(OSError):  # already closed
        request.shutdown(socket.SHUT_RDWR)


def serve(routes: Routes, host: str, port: int, section: str) -> ThreadingHTTPServer:
    """Serve ``routes`` (exact paths; a query string is ignored) on a daemon thread. An address
    that cannot be bound is a :class:`ConfigurationError` naming ``section``'s settings."""

    class Handler(BaseHTTPRequestHandler):
        timeout = CONNECTION_SECONDS  # each read; the whole connection is bounded by _cut

        def do_GET(self) -> None:
            self._answer(body=True)

        def do_HEAD(self) -> None:
            self._answer(body=False)

        def _answer(self, body: bool) -> None:
            route = routes.get(urlsplit(self.path).path)
            status, content_type, data = route() if route else (404, "text/plain", b"not found\n")
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if body:
                self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            return

    try:
        server = _Server((host, port), Handler)
    except (OSError, ValueError, TypeError) as exc:  # unresolvable, taken, privileged port
        raise unlistenable(host, port, exc, section) from None
    name = f"outboxkit-{section}-http"
    threading.Thread(target=server.serve_forever, name=name, daemon=True).start()
    return server
