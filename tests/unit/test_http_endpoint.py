"""The metrics/health endpoint against clients it cannot choose: idle connections, resets,
odd paths. Before, every connection held a thread and a descriptor for as long as its client
liked: a thousand idle ones took a relay's descriptors (no database or Kafka connection could
be opened, so it published nothing), and a reset client printed a traceback to stderr."""

from __future__ import annotations

import os
import select
import socket
import struct
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import ThreadingHTTPServer

import pytest

from outboxkit import http_endpoint
from outboxkit.http_endpoint import MAX_CONNECTIONS, serve

pytestmark = pytest.mark.unit

ROUTES = {"/healthz": lambda: (200, "application/json", b'{"ok": true}')}


@pytest.fixture
def seconds() -> float:
    return 1.0


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch, seconds: float) -> Iterator[ThreadingHTTPServer]:
    monkeypatch.setattr(http_endpoint, "CONNECTION_SECONDS", seconds)
    started = serve(ROUTES, "127.0.0.1", 0, "relay")
    yield started
    started.shutdown()
    started.server_close()


def _url(server: ThreadingHTTPServer, path: str) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}{path}"


def _idle(server: ThreadingHTTPServer) -> socket.socket:
    client = socket.create_connection(("127.0.0.1", server.server_address[1]), timeout=10)
    client.sendall(b"GET /healthz HTTP/1.1\r\n")  # and never the end of its headers
    return client


def _open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def _answered(server: ThreadingHTTPServer) -> bool:
    try:
        with urllib.request.urlopen(_url(server, "/healthz"), timeout=5) as answer:
            return answer.status == 200
    except (urllib.error.URLError, OSError):
        return False


@pytest.mark.parametrize("seconds", [60.0])
def test_idle_clients_beyond_the_cap_are_closed_at_once(server: ThreadingHTTPServer) -> None:
    before = _open_descriptors()
    clients = [_idle(server) for _ in range(4 * MAX_CONNECTIONS)]
    try:
        refused = 0
        deadline = time.monotonic() + 30
        while refused < 3 * MAX_CONNECTIONS and time.monotonic() < deadline:
            open_ones = [c for c in clients if c.fileno() != -1]
            for client in open_ones:
                if client in select.select([client], [], [], 0)[0] and client.recv(1) == b"":
                    client.close()
                    refused += 1
        assert refused == 3 * MAX_CONNECTIONS
        held = _open_descriptors() - before - (len(clients) - refused)
        assert held <= MAX_CONNECTIONS + 2, held  # the server's side, whatever clients do
    finally:
        for client in clients:
            client.close()
    deadline = time.monotonic() + 30
    while not _answered(server):  # the slots free once those clients are gone
        assert time.monotonic() < deadline, "no slot came free"


def test_an_idle_client_is_closed_after_its_time(server: ThreadingHTTPServer) -> None:
    with _idle(server) as client:
        client.settimeout(30)
        assert client.recv(1024) == b""  # closed by the server (1 s here), unanswered
    assert _answered(server)


def test_a_client_that_resets_prints_no_traceback(
    server: ThreadingHTTPServer, capfd: pytest.CaptureFixture[str]
) -> None:
    for _ in range(5):
        client = socket.create_connection(("127.0.0.1", server.server_address[1]), timeout=10)
        client.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        client.close()  # a reset, before the answer is read
    assert _answered(server)
    assert "Traceback" not in capfd.readouterr().err


def test_paths_are_exact_and_head_is_answered(server: ThreadingHTTPServer) -> None:
    with urllib.request.urlopen(_url(server, "/healthz?verbose=1"), timeout=5) as answer:
        assert answer.status == 200
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(_url(server, "/healthzXYZ"), timeout=5)
    assert caught.value.code == 404
    caught.value.close()
    request = urllib.request.Request(_url(server, "/healthz"), method="HEAD")
    with urllib.request.urlopen(request, timeout=5) as answer:
        assert answer.status == 200
        assert answer.headers["Content-Length"] == str(len(b'{"ok": true}'))
        assert answer.read() == b""
