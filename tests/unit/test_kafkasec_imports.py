"""The verify tool's read-back is built behind the Kafka seam (``test_architecture.py`` checks
that only ``outboxkit/kafka/`` imports a client), so it gets the shared settings and the typed
refusal of a configuration; it connects to PostgreSQL through ``outboxkit.db.connect``, whose
errors never quote a password."""

from __future__ import annotations

from pathlib import Path

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
