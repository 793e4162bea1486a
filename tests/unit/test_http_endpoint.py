"""The metrics/health endpoint against clients it cannot choose: idle connections, slow ones,
resets, odd paths. Before, every connection held a thread and a descriptor for as long as its
client liked: a thousand idle ones took a relay's descriptors (no database or Kafka connection
could be opened, so it published nothing), and a reset client printed a traceback to stderr."""

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
from prometheus_client import CollectorRegistry, Counter

from outboxkit import http_endpoint
from outboxkit.http_endpoint import MAX_CONNECTIONS, Answer, scrape, serve

pytestmark = pytest.mark.unit


def _failing(accept: str | None) -> Answer:
    raise RuntimeError("a route's own bug")


ROUTES = {
    "/healthz": lambda accept: (200, "application/json", b'{"ok": true}'),
    "/broken": _failing,
}


@pytest.fixture
def limits() -> tuple[float, float]:
    """(seconds per read, seconds per connection)."""
    return (60.0, 60.0)


@pytest.fixture
def server(
    monkeypatch: pytest.MonkeyPatch, limits: tuple[float, float]
) -> Iterator[ThreadingHTTPServer]:
    monkeypatch.setattr(http_endpoint, "READ_SECONDS", limits[0])
    monkeypatch.setattr(http_endpoint, "CONNECTION_SECONDS", limits[1])
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


def _wait_answered(server: ThreadingHTTPServer) -> None:
    deadline = time.monotonic() + 30
    while not _answered(server):
        assert time.monotonic() < deadline, "no slot came free"


def test_idle_clients_beyond_the_cap_are_closed_at_once(server: ThreadingHTTPServer) -> None:
    before = _open_descriptors()
    clients = [_idle(server) for _ in range(4 * MAX_CONNECTIONS)]
    try:
        refused: set[socket.socket] = set()
        deadline = time.monotonic() + 30
        while len(refused) < 3 * MAX_CONNECTIONS and time.monotonic() < deadline:
            waiting = [c for c in clients if c not in refused]
            for client in select.select(waiting, [], [], 1.0)[0]:
                if client.recv(1) == b"":  # closed by the server, unread
                    refused.add(client)
        assert len(refused) == 3 * MAX_CONNECTIONS
        held = _open_descriptors() - before - len(clients)
        assert held <= MAX_CONNECTIONS + 2, held  # the server's side, whatever clients do
    finally:
        for client in clients:
            client.close()
    _wait_answered(server)  # the slots free once those clients are gone


@pytest.mark.parametrize("limits", [(60.0, 1.0)])
def test_a_client_that_keeps_sending_slowly_is_cut_after_its_time(
    server: ThreadingHTTPServer,
) -> None:
    """Each read is quick (a header line every 0.5 s), so only the connection's own time ends
    it: a client dribbling its request would otherwise hold its slot for as long as it liked."""
    began = time.monotonic()
    with _idle(server) as client:
        client.settimeout(0.5)  # fewer than the 100 headers a request may have, in 30 s
        closed = False
        while not closed and time.monotonic() - began < 30:
            try:
                closed = client.recv(1024) == b""
            except TimeoutError:
                try:
                    client.sendall(b"X-Slow: 1\r\n")
                except OSError:
                    closed = True
            except OSError:
                closed = True
    assert closed, "the slow client was never cut"
    _wait_answered(server)


@pytest.mark.parametrize("limits", [(0.5, 60.0)])
def test_a_silent_client_is_closed_after_a_read_times_out(server: ThreadingHTTPServer) -> None:
    with _idle(server) as client:
        client.settimeout(30)
        assert client.recv(1024) == b""  # closed by the server, unanswered
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


def test_paths_are_exact_head_is_answered_and_a_failing_route_is_a_500(
    server: ThreadingHTTPServer,
) -> None:
    with urllib.request.urlopen(_url(server, "/healthz?verbose=1"), timeout=5) as answer:
        assert answer.status == 200
    for path, status in (("/healthzXYZ", 404), ("/broken", 500)):
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(_url(server, path), timeout=5)
        assert caught.value.code == status
        caught.value.close()
    request = urllib.request.Request(_url(server, "/healthz"), method="HEAD")
    with urllib.request.urlopen(request, timeout=5) as answer:
        assert answer.status == 200
        assert answer.headers["Content-Length"] == str(len(b'{"ok": true}'))
        assert answer.read() == b""


def test_metrics_are_openmetrics_when_asked() -> None:
    registry = CollectorRegistry()
    Counter("outboxkit_test_things", "things", registry=registry).inc()
    server = serve({"/metrics": scrape(registry)}, "127.0.0.1", 0, "consumer")
    try:
        url = _url(server, "/metrics")
        with urllib.request.urlopen(url, timeout=5) as answer:
            assert answer.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            assert b"outboxkit_test_things_total 1.0" in answer.read()
        accept = {"Accept": "application/openmetrics-text; version=1.0.0"}
        with urllib.request.urlopen(urllib.request.Request(url, headers=accept)) as answer:
            assert answer.headers["Content-Type"].startswith("application/openmetrics-text")
            assert answer.read().endswith(b"# EOF\n")
    finally:
        server.shutdown()
        server.server_close()


def test_an_ipv6_address_is_served() -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6 here")
    try:
        server = serve({"/healthz": ROUTES["/healthz"]}, "::1", 0, "consumer")
    except Exception as exc:  # a host without ::1 configured
        pytest.skip(f"::1 cannot be bound here: {exc}")
    try:
        port = server.server_address[1]
        with urllib.request.urlopen(f"http://[::1]:{port}/healthz", timeout=5) as answer:
            assert answer.status == 200
    finally:
        server.shutdown()
        server.server_close()
