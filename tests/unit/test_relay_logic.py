"""Pure logic of the relay: configuration, fault specs, error kinds, back-off, lease trust."""

from __future__ import annotations

import random
import uuid
from pathlib import Path

import pytest

from outboxkit.errors import ConfigurationError, LeaseLostError
from outboxkit.relay.checkpoint import Checkpoint, checkpoint_key
from outboxkit.relay.config import Mode, OnPublish, ParkedKeyPolicy, load_config
from outboxkit.relay.faults import parse_fault
from outboxkit.relay.lease import LeaseTerm, trust_margin
from outboxkit.relay.producer.base import RecordError, transactional_id
from outboxkit.relay.producer.errors import ErrorKind, classify
from outboxkit.relay.reader import OutboxRecord
from outboxkit.relay.shard_worker import backoff_delay

pytestmark = pytest.mark.unit

SECRET_URL = "postgresql://relay:s3cret-pw@db.example:5432/app"


def test_config_layers_file_then_env_then_overrides(tmp_path: Path) -> None:
    path = tmp_path / "relay.toml"
    path.write_text(
        '[relay]\ndatabase_url = "postgresql:///file"\nkafka_bootstrap = "file:9092"\n'
        'batch_size = 50\nmode = "at_least_once"\n'
    )
    env = {"OUTBOXKIT_KAFKA_BOOTSTRAP": "env:9092", "OUTBOXKIT_RELAY_SHARDS": "1,3"}
    config = load_config(path, env=env, overrides={"batch_size": 7, "lease_ttl": None})
    assert config.database_url.get_secret_value() == "postgresql:///file"
    assert config.kafka_bootstrap == "env:9092"
    assert config.batch_size == 7
    assert config.owned_shards == (1, 3)
    assert config.mode is Mode.AT_LEAST_ONCE
    assert config.on_publish is OnPublish.MARK
    assert config.parked_key_policy is ParkedKeyPolicy.WAIT
    assert config.lease_ttl == 15.0


def test_secrets_never_show_in_repr_summary_or_errors() -> None:
    config = load_config(
        env={"OUTBOXKIT_DATABASE_URL": SECRET_URL, "OUTBOXKIT_KAFKA_BOOTSTRAP": "k"}
    )
    assert "s3cret" not in repr(config)
    assert "s3cret" not in str(config.safe_summary())
    with pytest.raises(ConfigurationError) as caught:
        load_config(env={"OUTBOXKIT_DATABASE_URL": SECRET_URL, "OUTBOXKIT_RELAY_BATCH_SIZE": "x"})
    assert "s3cret" not in str(caught.value)
    assert "batch_size" in str(caught.value)


def test_retention_can_be_switched_off() -> None:
    env = {
        "OUTBOXKIT_DATABASE_URL": "x",
        "OUTBOXKIT_KAFKA_BOOTSTRAP": "k",
        "OUTBOXKIT_RELAY_RETENTION_SECONDS": "forever",
        "OUTBOXKIT_RELAY_LISTEN": "false",
    }
    config = load_config(env=env)
    assert config.retention_seconds is None
    assert config.listen is False


@pytest.mark.parametrize(
    ("spec", "point", "nth", "stop"),
    [
        ("after_claim", "after_claim", 1, False),
        ("after_produce:3", "after_produce", 3, False),
        ("after_kafka_commit:2:stop", "after_kafka_commit", 2, True),
    ],
)
def test_fault_specs(spec: str, point: str, nth: int, stop: bool) -> None:
    parsed = parse_fault(spec)
    assert parsed is not None
    assert (parsed.point, parsed.nth, parsed.stop) == (point, nth, stop)


def test_unknown_fault_point_is_refused_and_empty_means_off() -> None:
    assert parse_fault("") is None
    assert parse_fault(None) is None
    with pytest.raises(ValueError, match="unknown fault point"):
        parse_fault("before_everything")


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("MSG_SIZE_TOO_LARGE", ErrorKind.PERMANENT),
        ("UNKNOWN_TOPIC_OR_PART", ErrorKind.PERMANENT),
        ("TOPIC_AUTHORIZATION_FAILED", ErrorKind.PERMANENT),
        ("INVALID_TOPIC_EXCEPTION", ErrorKind.PERMANENT),
        ("MessageSizeTooLargeError", ErrorKind.PERMANENT),
        ("UnknownTopicOrPartitionError", ErrorKind.PERMANENT),
        ("_FENCED", ErrorKind.FENCED),
        ("ProducerFenced", ErrorKind.FENCED),
        ("INVALID_PRODUCER_EPOCH", ErrorKind.FENCED),
        ("_MSG_TIMED_OUT", ErrorKind.RETRIABLE),
        ("NOT_ENOUGH_REPLICAS", ErrorKind.RETRIABLE),
        ("KafkaConnectionError", ErrorKind.RETRIABLE),
    ],
)
def test_error_classification(name: str, kind: ErrorKind) -> None:
    assert classify(name) is kind
    assert RecordError(name, "m").kind is kind


def test_backoff_is_bounded_jittered_and_grows() -> None:
    rng = random.Random(7)
    delays = [backoff_delay(n, 0.2, 5.0, rng) for n in range(1, 12)]
    assert all(0.1 <= d <= 5.0 for d in delays)
    assert max(delays[-3:]) > max(delays[:2])
    assert 2.5 <= backoff_delay(50, 0.2, 5.0, rng) <= 5.0


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("ttl", [1.0, 3.0, 15.0, 60.0])
def test_trust_window_ends_before_the_lease_can_expire(ttl: float) -> None:
    clock = FakeClock()
    term = LeaseTerm("g", 0, "me", 5, ttl, 0.0, clock)
    term.extend(sent_at=clock.now)
    assert 0 < trust_margin(ttl) < ttl
    clock.now += ttl - trust_margin(ttl) - 0.001
    term.check()
    assert term.held
    clock.now += 0.002  # still before the database expiry (sent_at + ttl), but no longer trusted
    assert not term.held
    with pytest.raises(LeaseLostError):
        term.check()


def test_lost_is_sticky_even_if_a_late_renewal_lands() -> None:
    clock = FakeClock()
    term = LeaseTerm("g", 1, "me", 9, 3.0, 0.0, clock)
    term.extend(clock.now)
    term.mark_lost("renewal matched no row")
    term.extend(clock.now)
    with pytest.raises(LeaseLostError, match="renewal matched no row"):
        term.check()


def test_checkpoint_round_trip_and_key() -> None:
    rows = ((1, uuid.uuid4()), (5, uuid.uuid4()))
    checkpoint = Checkpoint("g", 3, 42, rows)
    assert Checkpoint.decode("g", 3, checkpoint.encode()) == checkpoint
    assert checkpoint_key("g", 3) == b"g/3"
    assert transactional_id("g", 3) == "outboxkit-relay.g.3"
    assert transactional_id("g", 3) != transactional_id("g", 4)


def test_record_headers_carry_identity_and_trace_context() -> None:
    event_id = uuid.uuid4()
    record = OutboxRecord(
        id=1,
        event_id=event_id,
        idempotency_key="idem-1",
        topic="t",
        key="k",
        payload=b"{}",
        content_type="application/json",
        headers={"traceparent": "00-a-b-01", "event-id": "spoofed"},
        event_type="order.placed",
        schema_version=2,
        aggregate_type=None,
        aggregate_id=None,
        attempts=0,
    )
    headers = dict(record.kafka_headers())
    assert headers["event-id"] == str(event_id).encode()  # the row's identity wins
    assert headers["idempotency-key"] == b"idem-1"
    assert headers["event-type"] == b"order.placed"
    assert headers["schema-version"] == b"2"
    assert headers["traceparent"] == b"00-a-b-01"
    assert "aggregate-id" not in headers


def test_the_shipped_example_configuration_is_valid() -> None:
    example = Path(__file__).resolve().parents[2] / "relay" / "relay.example.toml"
    env = {"OUTBOXKIT_DATABASE_URL": SECRET_URL, "OUTBOXKIT_KAFKA_BOOTSTRAP": "kafka:9092"}
    config = load_config(example, env=env)
    assert config.mode is Mode.EXACTLY_ONCE
    assert config.metrics_port == 9400
