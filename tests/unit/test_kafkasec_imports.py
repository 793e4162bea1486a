"""The verify tool's read-back is built behind the Kafka seam (``test_architecture.py`` checks
that only ``outboxkit/kafka/`` imports a client), so it gets the shared settings and the typed
refusal of a configuration; it connects to PostgreSQL through ``outboxkit.db.connect``, whose
errors never quote a password."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from outboxkit.errors import ConfigurationError, OutboxkitError
from outboxkit.settings import KafkaSettings

pytestmark = pytest.mark.unit

PACKAGE = Path(__file__).resolve().parents[2] / "outboxkit"
LIBRARIES = ("confluent_kafka", "aiokafka")
SECRET = "s3cret-pw-not-shown"


def test_the_verify_read_back_refuses_a_configuration_with_a_typed_error() -> None:
    pytest.importorskip("confluent_kafka")
    from outboxkit.verify.collect import read_topics
    from outboxkit.verify.history import TopicSpec

    settings = KafkaSettings(bootstrap="127.0.0.1:1", properties={"no.such.property": SECRET})
    with pytest.raises(ConfigurationError) as caught:
        read_topics(settings, [TopicSpec(name="t", partitions=1)], timeout=1.0)
    assert "'no.such.property'" in str(caught.value)
    assert SECRET not in str(caught.value)


def test_the_verify_tool_connects_through_the_database_seam() -> None:
    """A password with an unencoded ``@``: libpq would read part of it as the host and quote
    it; the seam refuses the URL in one line quoting nothing of it."""
    from outboxkit.verify import collect

    url = f"postgresql://u:{SECRET}@x@127.0.0.1:1/db"
    for call in (
        lambda: collect.progress(url, "outboxkit", ["t"], ["c"]),
        lambda: collect.read_database(url, "outboxkit", ["c"]),
    ):
        with pytest.raises(OutboxkitError) as caught:
            call()
        assert "the database URL is invalid" in str(caught.value)
        assert SECRET not in str(caught.value)


class _Fetched:
    """A confluent-kafka message as the read-back polls it: a record, or a partition's end."""

    def __init__(self, offset: int | None) -> None:
        self._offset = offset

    def error(self) -> Any:
        if self._offset is not None:
            return None
        from confluent_kafka import KafkaError

        return KafkaError(KafkaError._PARTITION_EOF)

    def topic(self) -> str:
        return "t"

    def partition(self) -> int:
        return 0

    def offset(self) -> int | None:
        return self._offset

    def key(self) -> bytes:
        return b"k"

    def value(self) -> bytes:
        return b"v"

    def headers(self) -> list[tuple[str, bytes]]:
        return [("event-id", b"e1")]

    def timestamp(self) -> tuple[int, int]:
        return (1, 1700)


class _Reader:
    def __init__(self, conf: Any) -> None:
        self._polled = [_Fetched(4), _Fetched(None)]

    def assign(self, partitions: Any) -> None:
        pass

    def poll(self, timeout: float) -> _Fetched:
        return self._polled.pop(0)

    def close(self) -> None:
        pass


def test_the_read_back_builds_its_records_as_the_group_consumer_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One builder for both confluent readers (the read-back dropped the timestamp)."""
    pytest.importorskip("confluent_kafka")
    from outboxkit.kafka import confluent_readback
    from outboxkit.kafka.confluent_consumer import consumed_record

    monkeypatch.setattr(confluent_readback, "Consumer", _Reader)
    settings = KafkaSettings(bootstrap="127.0.0.1:1")
    records = confluent_readback.read_to_end(settings, [("t", 0)], timeout=30.0)
    assert records == [consumed_record(_Fetched(4))]  # type: ignore[arg-type]
    assert records[0].timestamp_ms == 1700
