"""OAUTHBEARER tokens that expire while the relay and a consumer keep running.

In production a token lives about an hour: librdkafka fetches a new one at 80% of its lifetime
and re-authenticates its connections with it (KIP-368) before the broker, which ends a session
when its token expires, closes them. Here the tokens live a few seconds. The relay (exactly-once)
and a consumer, configured from ``OUTBOXKIT_KAFKA_*`` variables alone, log in with the OIDC
client-credentials method, as in production, at a stand-in identity provider in this process
that issues unsigned JWTs (which the broker's default validator takes). The broker (this
module's own, with ``connections.max.reauth.ms`` as in production) logs every authentication
with its token's expiry, and each expiry names the client the token was issued to.

While rows keep arriving, the test waits until each process has re-authenticated with a token
issued two lifetimes after its first (so its first two have expired), then checks that every row
was published and handled exactly once and in order, and that the broker refused no token. Its
counterpart has the identity provider hand out the first token again (a refresh that brings
nothing new): the broker then refuses the relay's tokens, which is what the first test would see
if refresh broke.

librdkafka's other built-in way, its own unsecured token (``enable.sasl.oauthbearer.unsecure.jwt``),
is not used here: that token is refreshed only when the application polls the client, so a client
outboxkit keeps open but idle (the consumer's dead-letter producer between records, for one)
presents an expired one. OIDC refreshes on librdkafka's background thread.
"""

from __future__ import annotations

import base64
import dataclasses
import http.server
import json
import re
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from outboxkit import Message, Outbox
from outboxkit.devstack import KafkaServer
from tests.fault.test_secured_kafka import Processes, _create_topics
from tests.fault.test_secured_kafka_oauth import _env, own_broker
from tests.integration.inbox_support import EFFECT_DDL, EVENT_TYPE, PaymentRequested, effects
from tests.support.topics import read_topic
from tests.support.waiting import wait_for

pytestmark = pytest.mark.fault

# Refreshed at 80% of its life, checked each second: 8 s leaves the fetch 0.6 s at worst.
LIFE_SECONDS = 8
LIFETIMES = 2  # each process re-authenticates with a token issued this many lifetimes after
# its first: by then its first two tokens have expired (each is replaced after 80% of its life)
REAUTH_MS = 3_600_000  # the broker's cap, as in production: the tokens' expiry comes first
KEYS = 3
RELAY, CONSUMER = "relay", "billing"  # the OIDC client ids

_LINE = re.compile(r"^\[[^]]+\] \[(?P<thread>[^]]+)\] \w+ (?P<text>.*)$")
_COMPLETE = re.compile(
    r"Authentication complete; .* credential expiration=(?P<expires>\S+) .*"
    r"sending (?P<sent>\d+) ms to client"
)


def _b64(value: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()


class TokenIssuer:
    """A stand-in identity provider: the client-credentials grant answered with an unsigned JWT
    that expires ``LIFE_SECONDS`` later. Every token's expiry (in ms) is unique and remembered
    with the client id it went to, so a broker log line can be traced to a process.
    ``refresh=False`` hands each client its first token again, however often it asks."""

    def __init__(self, *, refresh: bool = True) -> None:
        self.refresh = refresh
        self.issued: dict[int, str] = {}  # expiry in ms -> client id
        self._first: dict[str, bytes] = {}
        self._lock = threading.Lock()
        issuer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", "0")))
                basic = self.headers.get("Authorization", "").removeprefix("Basic ")
                client = base64.b64decode(basic).decode().split(":")[0]
                body = issuer.token_response(client)
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/token"

    def token_response(self, client: str) -> bytes:
        with self._lock:
            if not self.refresh and client in self._first:
                return self._first[client]
            now_ms = int(time.time() * 1000)
            expires_ms = now_ms + LIFE_SECONDS * 1000
            while expires_ms in self.issued:
                expires_ms += 1
            self.issued[expires_ms] = client
            claims = {"sub": client, "iat": now_ms / 1000, "exp": expires_ms / 1000}
            token = f"{_b64({'alg': 'none'})}.{_b64(claims)}."
            body = json.dumps(
                {"access_token": token, "token_type": "bearer", "expires_in": LIFE_SECONDS}
            ).encode()
            self._first.setdefault(client, body)
            return body

    def properties(self, client: str) -> dict[str, str]:
        """The ``[kafka] properties`` an operator would give for this provider."""
        return {
            "sasl.mechanism": "OAUTHBEARER",
            "sasl.oauthbearer.method": "oidc",
            "sasl.oauthbearer.client.id": client,
            "sasl.oauthbearer.client.secret": "unchecked",
            "sasl.oauthbearer.token.endpoint.url": self.url,
        }

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@dataclasses.dataclass
class Sessions:
    """What the broker's log says about the OAUTHBEARER sessions of one issuer's tokens."""

    tokens: dict[str, set[int]]  # client id -> expiries of the tokens it authenticated with
    reauth_tokens: dict[str, set[int]]  # the same, for re-authentications only
    sent_ms: list[int]  # each session's lifetime, as told to the client
    reauthenticated: int  # "Successfully re-authenticated" lines (any client)
    refused: list[str]  # failed (re-)authentications: a token the broker would not take

    @classmethod
    def parse(cls, text: str, issuer: TokenIssuer) -> Sessions:
        sessions = cls({}, {}, [], 0, [])
        reauth_begun: dict[str, int] = {}  # per network thread: re-authentications under way
        for line in text.splitlines():
            match = _LINE.match(line)
            if match is None:
                continue
            thread, body = match["thread"], match["text"]
            if body.startswith("Beginning re-authentication"):
                reauth_begun[thread] = reauth_begun.get(thread, 0) + 1
            elif (complete := _COMPLETE.search(body)) is not None:
                expires = int(datetime.fromisoformat(complete["expires"]).timestamp() * 1000)
                reauth = reauth_begun.get(thread, 0) > 0
                if reauth:
                    reauth_begun[thread] -= 1
                client = issuer.issued.get(expires)
                if client is None:  # another test's token
                    continue
                sessions.sent_ms.append(int(complete["sent"]))
                sessions.tokens.setdefault(client, set()).add(expires)
                if reauth:
                    sessions.reauth_tokens.setdefault(client, set()).add(expires)
            elif "Successfully re-authenticated" in body:
                sessions.reauthenticated += 1
            elif "Failed re-authentication" in body or "Failed authentication" in body:
                sessions.refused.append(line)
        return sessions

    def lifetimes(self, client: str) -> float:
        """Token lifetimes between the client's first token and the latest one it
        re-authenticated with: only refreshed tokens get that far."""
        first, latest = self.tokens.get(client), self.reauth_tokens.get(client)
        if not first or not latest:
            return 0.0
        return (max(latest) - min(first)) / 1000 / LIFE_SECONDS


@pytest.fixture(scope="module")
def refresh_kafka() -> Iterator[KafkaServer]:
    """A broker of this module's own (~5 s to start), logging its authentications."""
    yield from own_broker(reauth_ms=REAUTH_MS)


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[Processes]:
    running = Processes(tmp_path)
    yield running
    running.stop()


class RowWriter:
    """Writes payments through the outbox, one at a time, until stopped: the n-th has amount n
    and key ``k{n % KEYS}``, so each key's order is its amounts' order."""

    def __init__(self, sa_url: str, topic: str) -> None:
        self._engine = create_engine(sa_url)
        self._topic = topic
        self._stop = threading.Event()
        self.event_ids: list[str] = []
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        n = 0
        while not self._stop.wait(0.1):
            event = PaymentRequested(order_id=f"o-{n}", amount=n)
            message = Message(
                topic=self._topic, payload=event, key=f"k{n % KEYS}", event_type=EVENT_TYPE
            )
            with Session(self._engine) as session, session.begin():
                self.event_ids.append(str(Outbox().add(session, message).event_id))
            n += 1

    def __enter__(self) -> RowWriter:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)
        self._engine.dispose()


def _published(db_url: str) -> int:
    with psycopg.connect(db_url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM outboxkit.outbox_message WHERE state = 'published'"
        ).fetchone()
    return int(row[0]) if row else 0


def _start(
    processes: Processes,
    server: KafkaServer,
    issuer: TokenIssuer,
    db_url: str,
    topic: str,
    *,
    consumer: bool = True,
) -> None:
    def env(client: str) -> dict[str, str]:
        return _env(
            db_url,
            server,
            OUTBOXKIT_KAFKA_CLIENT="confluent",
            OUTBOXKIT_KAFKA_PROPERTIES=json.dumps(issuer.properties(client)),
            OUTBOXKIT_CONSUMER_NAME=CONSUMER,
            OUTBOXKIT_CONSUMER_GROUP=f"g-{uuid.uuid4().hex[:8]}",
            OUTBOXKIT_CONSUMER_TOPICS=topic,
        )

    processes.start(["relay", "run"], env(RELAY))
    if consumer:
        registry = "tests.fault.consumer_app:SYNC"
        processes.start(["inbox", "run", "--registry", registry], env(CONSUMER))


@pytest.fixture
def topic(refresh_kafka: KafkaServer, outboxkit_db_url: str) -> str:
    name = f"payments-{uuid.uuid4().hex[:8]}"
    _create_topics(refresh_kafka, name, f"{name}.dlq")
    with psycopg.connect(outboxkit_db_url) as conn:
        conn.execute(EFFECT_DDL)
    return name


def test_relay_and_consumer_keep_working_as_their_tokens_expire(
    refresh_kafka: KafkaServer,
    outboxkit_db_url: str,
    sa_url: str,
    topic: str,
    processes: Processes,
) -> None:
    server = refresh_kafka
    issuer = TokenIssuer()
    before = len(server.auth_log())  # the module's broker: only this test's lines count
    _start(processes, server, issuer, outboxkit_db_url, topic)

    def sessions() -> Sessions:
        return Sessions.parse(server.auth_log()[before:], issuer)

    def failed(what: str) -> AssertionError:
        return AssertionError(f"{what}; {sessions()}\nprocesses:\n{processes.output()}")

    def refreshed() -> bool:
        seen = sessions()
        assert seen.refused == [], "the broker refused a token"  # fails at once, not at timeout
        return min(seen.lifetimes(client) for client in (RELAY, CONSUMER)) >= LIFETIMES

    try:  # the processes stop before the issuer does: they need it until then
        try:
            with RowWriter(sa_url, topic) as writer:
                wait_for(
                    refreshed,
                    timeout=120,
                    what=f"both processes re-authenticated with tokens over {LIFETIMES} lifetimes",
                )
                # Rows written from now on need connections whose first tokens expired long ago.
                late = len(writer.event_ids)
                wait_for(lambda: len(writer.event_ids) >= late + KEYS, timeout=30, what="late")
            written = writer.event_ids
            wait_for(lambda: _published(outboxkit_db_url) == len(written), what="all published")
            wait_for(lambda: len(effects(outboxkit_db_url)) >= len(written), what="all handled")
        except AssertionError as exc:
            raise failed(str(exc)) from None
        seen = sessions()
    finally:
        processes.stop()
        issuer.close()

    assert seen.sent_ms
    assert max(seen.sent_ms) <= LIFE_SECONDS * 1000  # no session outlived its token
    for client in (RELAY, CONSUMER):
        assert len(seen.reauth_tokens[client]) >= LIFETIMES  # new tokens, not the first again
    assert seen.refused == []  # no token was refused (an expired one would be)
    assert "Traceback" not in processes.output()

    published = read_topic(server.plaintext_bootstrap, topic, expect=len(written), quiet=1.0)
    by_key: dict[str, list[int]] = {}
    for record in published:
        by_key.setdefault(record.key().decode(), []).append(json.loads(record.value())["amount"])
    in_order = {f"k{k}": list(range(k, len(written), KEYS)) for k in range(KEYS)}
    assert by_key == in_order  # exactly once, in order
    handled = effects(outboxkit_db_url)
    assert sorted(e[0] for e in handled) == sorted(written)  # each handled once
    handled_by_key: dict[int, list[int]] = {}
    for _, _, amount in handled:
        handled_by_key.setdefault(amount % KEYS, []).append(amount)
    assert all(amounts == sorted(amounts) for amounts in handled_by_key.values())


def test_a_token_that_is_never_renewed_is_refused(
    refresh_kafka: KafkaServer, outboxkit_db_url: str, topic: str, processes: Processes
) -> None:
    """What the test above would see if refresh broke: the relay's clients keep presenting
    their first token, and once it expires the broker takes it no more."""
    server = refresh_kafka
    issuer = TokenIssuer(refresh=False)
    before = len(server.auth_log())  # the module's broker: only this test's lines count
    _start(processes, server, issuer, outboxkit_db_url, topic, consumer=False)

    def sessions() -> Sessions:
        return Sessions.parse(server.auth_log()[before:], issuer)

    try:
        wait_for(lambda: sessions().refused, timeout=60, what="the broker refusing a token")
        seen = sessions()
    finally:
        processes.stop()
        issuer.close()
    assert seen.tokens == {RELAY: set(issuer.issued)}  # the one token, presented again and again
    assert "invalid_token" in "\n".join(seen.refused), seen.refused
