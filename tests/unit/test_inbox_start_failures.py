"""What a failed start of the aiokafka consumer says, and whether waiting can fix it.

``outboxkit inbox run`` retries a start that failed with a ``PublishError`` (Kafka away, a login
or an ACL refused) and ends on a ``PermanentPublishError``: a join the broker refuses for the
consumer's own settings must end it, not be retried for ever. Also: a consumer's ``stop=`` of
the other client's event type is refused, not silently never seen.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import threading
from typing import Any

import pytest

from outboxkit.errors import ConfigurationError, PermanentPublishError, PublishError
from outboxkit.settings import KafkaSettings

pytestmark = pytest.mark.unit

aiokafka_errors = pytest.importorskip("aiokafka.errors")


def _start_failing_with(monkeypatch: pytest.MonkeyPatch, error: Exception) -> BaseException:
    from aiokafka import AIOKafkaConsumer

    from outboxkit.kafka.aiokafka_consumer import AiokafkaGroupConsumer

    async def start(self: Any) -> None:
        raise error

    async def stop(self: Any) -> None:
        self._closed = True  # as aiokafka's own stop leaves it (else its __del__ warns later)

    monkeypatch.setattr(AIOKafkaConsumer, "start", start)
    monkeypatch.setattr(AIOKafkaConsumer, "stop", stop)

    async def subscribe() -> None:
        consumer = AiokafkaGroupConsumer(KafkaSettings(bootstrap="127.0.0.1:9"), "g")
        await consumer.subscribe(["t"], lambda tps: None, lambda tps: {})

    with pytest.raises(PublishError) as caught:
        asyncio.run(subscribe())
    return caught.value


@pytest.mark.parametrize(
    "name",
    [
        "InvalidSessionTimeoutError",
        "InvalidGroupIdError",
        "UnsupportedVersionError",
        "UnsupportedSaslMechanismError",
    ],
)
def test_a_join_refused_for_the_consumers_settings_is_permanent(
    monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    error = _start_failing_with(monkeypatch, getattr(aiokafka_errors, name)())
    assert isinstance(error, PermanentPublishError)
    assert "Kafka consumer could not start" in str(error)


@pytest.mark.parametrize(
    "error",
    [
        aiokafka_errors.KafkaConnectionError("Unable to bootstrap from [('127.0.0.1', 9)]"),
        aiokafka_errors.GroupAuthorizationFailedError(),
        aiokafka_errors.GroupCoordinatorNotAvailableError(),
        # no strategy shared with the members in the group: they may leave (a rolling deploy)
        aiokafka_errors.InconsistentGroupProtocolError(),
    ],
)
def test_a_start_waiting_can_fix_is_retriable(
    monkeypatch: pytest.MonkeyPatch, error: Exception
) -> None:
    assert not isinstance(_start_failing_with(monkeypatch, error), PermanentPublishError)


def test_a_tls12_certificate_alert_logged_as_it_is_still_reaches_the_watch() -> None:
    """TLS 1.2 logs the SSLError itself, a line the credentials hint rewrites without its args:
    the watch must see the record before that."""
    from outboxkit.kafka.aiokafka_certificate import CertificateWatch

    settings = KafkaSettings(bootstrap="127.0.0.1:9", security_protocol="SSL")
    alert = ssl.SSLError(1, "[SSL: SSLV3_ALERT_BAD_CERTIFICATE] sslv3 alert bad certificate")
    logger = logging.getLogger("aiokafka")
    with CertificateWatch(settings) as watch:
        logger.error('Unable connect to "%s:%s": %r', "127.0.0.1", 9, alert)
    assert watch.alerted


def test_a_stop_event_of_the_other_clients_type_is_refused() -> None:
    from sqlalchemy import create_engine
    from sqlalchemy.ext.asyncio import create_async_engine

    from outboxkit.inbox import AsyncInbox, Inbox
    from outboxkit.inbox.aiokafka import AiokafkaInboxConsumer
    from outboxkit.inbox.confluent import ConfluentInboxConsumer
    from outboxkit.inbox.delivery import InboxSettings
    from outboxkit.inbox.registry import EventRegistry

    settings = InboxSettings(consumer="c", registry=EventRegistry())
    kafka = KafkaSettings(bootstrap="127.0.0.1:9")
    sync_inbox = Inbox(create_engine("postgresql+psycopg://u@127.0.0.1:1/db"), settings)
    with pytest.raises(ConfigurationError, match=r"threading\.Event"):
        ConfluentInboxConsumer(sync_inbox, kafka, group_id="g", topics=["t"], stop=asyncio.Event())
    async_inbox = AsyncInbox(create_async_engine("postgresql+psycopg://u@127.0.0.1:1/db"), settings)
    with pytest.raises(ConfigurationError, match=r"asyncio\.Event"):
        AiokafkaInboxConsumer(
            async_inbox, kafka, group_id="g", topics=["t"], stop=threading.Event()
        )
