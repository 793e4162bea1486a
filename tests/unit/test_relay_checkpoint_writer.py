"""A checkpoint too large for its topic (the real-broker case is in
tests/integration/test_relay_checkpoint_size.py): the shard's transactions are halved, said once;
a one-row checkpoint that does not fit, or any other refusal, raises (the worker backs off)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from types import SimpleNamespace

import pytest

from outboxkit.errors import PublishError
from outboxkit.kafka.api import RecordError
from outboxkit.relay.checkpoint import CheckpointTopic
from outboxkit.relay.checkpoint_writer import CAP_PROBE_SECONDS, CheckpointWriter
from outboxkit.relay.claim_size import ClaimSizer
from outboxkit.settings import RelaySettings

EVENT = "00000000-0000-0000-0000-000000000001"
TOO_LARGE = RecordError("MSG_SIZE_TOO_LARGE", "Broker: Message size too large")


def _writer(clock: Callable[[], float] = lambda: 0.0) -> tuple[CheckpointWriter, ClaimSizer]:
    config = RelaySettings(batch_size=100, max_batch_size=500, transaction_max_rows=2000)
    topic = CheckpointTopic(None, "ckpt")  # type: ignore[arg-type]
    topic._partitions = 1
    sizer = ClaimSizer.for_relay(config)
    return CheckpointWriter(config, 0, topic, sizer, clock), sizer


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


def test_the_cap_is_tried_twice_as_large_a_minute_after_the_last_halving(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A raised topic limit takes effect without a restart: the cap doubles a minute after the
    last halving while transactions fill it, until the settings' size; a refusal meanwhile
    halves it and waits again."""
    now = [0.0]
    writer, sizer = _writer(lambda: now[0])
    caplog.set_level(logging.DEBUG, "outboxkit.relay")
    for rows in (2000, 1000, 500):
        _built(writer, rows)
        writer.refused(TOO_LARGE)
    assert sizer.max_rows == 250
    now[0] += CAP_PROBE_SECONDS - 1
    _built(writer, 250)
    assert sizer.max_rows == 250  # not yet
    now[0] += 1
    _built(writer, 250)  # the next transactions may be twice as large
    assert (sizer.max_rows, sizer.high, sizer.low) == (500, 500, 100)
    _built(writer, 500)
    writer.refused(TOO_LARGE)  # still too large: halved, and a minute to wait again
    assert sizer.max_rows == 250
    _built(writer, 10)  # a quiet shard: nothing tests a larger size, so none is tried
    now[0] += CAP_PROBE_SECONDS
    _built(writer, 10)
    assert sizer.max_rows == 250
    for expected in (500, 1000, 2000):
        _built(writer, sizer.max_rows)  # transactions fill the cap
        now[0] += CAP_PROBE_SECONDS
        _built(writer, sizer.max_rows)
        assert sizer.max_rows == expected
    assert not sizer.capped
    now[0] += CAP_PROBE_SECONDS
    _built(writer, 2000)
    assert (sizer.max_rows, sizer.high, sizer.low) == (2000, 500, 100)  # never past the settings
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert infos == [
        "shard 0: transactions of up to 2000 rows are tried again (as the settings allow: the"
        " checkpoint fits again)"
    ]
