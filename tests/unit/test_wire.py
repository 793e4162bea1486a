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


def test_digest_format_is_pinned() -> None:
    """Stored digests outlive releases (idempotency, consumer checks): the bytes hashed must
    never change. Reference: each part length-prefixed (8 bytes, big-endian), optional parts
    tagged 0x00 (absent) / 0x01 (present)."""
    import hashlib

    expected = hashlib.sha256()
    for part in (b"orders", b"\x01o-1", b"\x01order.placed", b"application/json", b'{"a":1}'):
        expected.update(len(part).to_bytes(8, "big") + part)
    assert content_digest(**BASE) == expected.digest()
    assert content_digest(**BASE).hex() == (
        "db3394a2d17026c7cbc9c6652156883d22290717c4b9134d6a69675782b5fa13"
    )
    bare = content_digest(
        topic="t", key=None, event_type=None, content_type="application/octet-stream", payload=b""
    )
    assert bare.hex() == "2879cc45d2f47caf0e17b6d4910c5ad0daef3dd9c15ebdadec8e664adb333020"
