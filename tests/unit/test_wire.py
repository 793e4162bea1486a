"""The content digest and header helpers shared by writer, relay and consumer."""

from __future__ import annotations

import pytest

from outboxkit.wire import content_digest, dict_to_headers, headers_to_dict

pytestmark = pytest.mark.unit

BASE = {
    "topic": "orders",
    "key": "o-1",
    "event_type": "order.placed",
    "content_type": "application/json",
    "payload": b'{"a":1}',
}


def test_digest_is_stable_and_32_bytes() -> None:
    assert content_digest(**BASE) == content_digest(**dict(BASE))
    assert len(content_digest(**BASE)) == 32


@pytest.mark.parametrize(
    "change",
    [
        {"topic": "orders2"},
        {"key": "o-2"},
        {"key": None},
        {"key": ""},
        {"event_type": None},
        {"event_type": "order.paid"},
        {"content_type": "text/plain"},
        {"payload": b'{"a":2}'},
    ],
)
def test_digest_changes_with_every_part(change: dict[str, object]) -> None:
    assert content_digest(**{**BASE, **change}) != content_digest(**BASE)  # type: ignore[arg-type]


def test_digest_is_not_fooled_by_moving_bytes_between_parts() -> None:
    a = content_digest(topic="ab", key="c", event_type=None, content_type="x", payload=b"")
    b = content_digest(topic="a", key="bc", event_type=None, content_type="x", payload=b"")
    assert a != b


def test_none_and_empty_key_differ() -> None:
    assert content_digest(**{**BASE, "key": None}) != content_digest(**{**BASE, "key": ""})  # type: ignore[arg-type]


def test_headers_round_trip_and_later_duplicates_win() -> None:
    headers = dict_to_headers({"event-id": "e1", "traceparent": "00-x"})
    assert headers == [("event-id", b"e1"), ("traceparent", b"00-x")]
    assert headers_to_dict([*headers, ("event-id", b"e2"), ("skip", None)]) == {
        "event-id": "e2",
        "traceparent": "00-x",
    }
    assert headers_to_dict(None) == {}
