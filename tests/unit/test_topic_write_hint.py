"""A record refused by its topic for want of Write says which ACL to grant, once."""

from __future__ import annotations

import pytest

from outboxkit.kafka.errors import TOPIC_WRITE_HINT, with_topic_write_hint

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "reason",
    [
        "TOPIC_AUTHORIZATION_FAILED: Broker: Topic authorization failed",
        "TopicAuthorizationFailedError: [Error 29]",
    ],
)
def test_a_refused_topic_names_the_acl_once(reason: str) -> None:
    hinted = with_topic_write_hint(reason)
    assert hinted.startswith(reason)
    assert TOPIC_WRITE_HINT in hinted
    assert with_topic_write_hint(hinted) == hinted


@pytest.mark.parametrize(
    "reason",
    [
        "MSG_SIZE_TOO_LARGE: Broker: Message size too large",
        "UNKNOWN_TOPIC_OR_PART: topic 'x' does not exist",
        "TRANSACTIONAL_ID_AUTHORIZATION_FAILED: refused",
    ],
)
def test_other_reasons_are_left_as_they_are(reason: str) -> None:
    assert with_topic_write_hint(reason) == reason
