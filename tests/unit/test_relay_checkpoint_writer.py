"""A checkpoint too large for its topic (the real-broker case is in
tests/integration/test_relay_checkpoint_size.py): the shard's transactions are halved, said once;
a one-row checkpoint that does not fit, or any other refusal, raises (the worker backs off)."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from outboxkit.errors import PublishError
from outboxkit.kafka.api import RecordError
from outboxkit.relay.checkpoint import CheckpointTopic
from outboxkit.relay.checkpoint_writer import CheckpointWriter
from outboxkit.relay.claim_size import ClaimSizer
from outboxkit.settings import RelaySettings

EVENT = "00000000-0000-0000-0000-000000000001"
TOO_LARGE = RecordError("MSG_SIZE_TOO_LARGE", "Broker: Message size too large")


def _writer() -> tuple[CheckpointWriter, ClaimSizer]:
    config = RelaySettings(batch_size=100, max_batch_size=500, transaction_max_rows=2000)
    topic = CheckpointTopic(None, "ckpt")  # type: ignore[arg-type]
    topic._partitions = 1
    sizer = ClaimSizer.for_relay(config)
    return CheckpointWriter(config, 0, topic, sizer), sizer


def _built(writer: CheckpointWriter, rows: int) -> None:
    term = SimpleNamespace(token=7)
    writer.records(term, 0, [(n, EVENT) for n in range(rows)])  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["MSG_SIZE_TOO_LARGE", "MessageSizeTooLargeError"])
def test_a_checkpoint_too_large_halves_the_transactions_and_says_so_once(
    name: str, caplog: pytest.LogCaptureFixture
) -> None:
    writer, sizer = _writer()
    caplog.set_level(logging.DEBUG, "outboxkit.relay")
    for rows, capped in ((2000, 1000), (1000, 500), (500, 250)):
        _built(writer, rows)
        writer.refused(RecordError(name, "too large"))
        assert (sizer.max_rows, sizer.high, sizer.low) == (capped, min(500, capped), 100)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "max.message.bytes of the checkpoint topic ckpt" in warnings[0].getMessage()
    assert "at most 1000 rows" in warnings[0].getMessage()


def test_a_one_row_checkpoint_too_large_or_another_refusal_raises() -> None:
    writer, sizer = _writer()
    _built(writer, 1)
    with pytest.raises(PublishError, match="even a one-row checkpoint"):
        writer.refused(TOO_LARGE)
    _built(writer, 50)
    with pytest.raises(PublishError, match="checkpoint record failed: NOT_ENOUGH_REPLICAS"):
        writer.refused(RecordError("NOT_ENOUGH_REPLICAS", "Broker: not enough replicas"))
    assert sizer.max_rows == 2000
