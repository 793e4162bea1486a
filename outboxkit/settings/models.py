"""The parts of the settings model: one class per process or engine, each with its own
``OUTBOXKIT_*`` prefix, so the same Kafka settings reach every client the product creates.
Secrets are ``SecretStr`` (the consumer's ``kafka_options`` values: ``Secret``): they never show
in a repr, a log line or an error message.

Every number is finite (``inf`` and ``nan`` are refused) and bounded where a larger value would
overflow downstream (a millisecond count handed to a Kafka client as a 32-bit integer, an
interval or timestamp PostgreSQL cannot represent) or wait for longer than anyone means: time
spans of the running process at most a day (``DAY``), retention windows at most a century
(``CENTURY``), the relay's Kafka timeout at most ``MAX_KAFKA_TIMEOUT``.
"""

from __future__ import annotations

import json
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    Secret,
    SecretStr,
    field_serializer,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    SettingsConfigDict,
)

from outboxkit.settings import kafka_names
from outboxkit.settings.checks import (
    SASL_SETTINGS,
    SSL_SETTINGS,
    non_empty_path,
    not_empty,
    property_values,
    security_problem,
    storable,
    topic_name,
)
from outboxkit.settings.checks import (  # re-exported: the dead-letter template's check
    topic_template_problem as topic_template_problem,
)
from outboxkit.settings.kafka_names import dead_letter_template, text_problem, topic_list

PREFIX = "OUTBOXKIT_"
CONFIG_ENV = "OUTBOXKIT_CONFIG"
SECRETS_DIR_ENV = "OUTBOXKIT_SECRETS_DIR"
MAX_PRODUCERS_PER_SHARD = 4  # exactly-once: the most transactional ids (slots) per shard
SCHEMA_ENV = "OUTBOXKIT_SCHEMA"

#: The longest time span (seconds) of a lease, interval, back-off or wait of a running process.
DAY = 86_400.0
#: The longest retention window (seconds): 100 years. PostgreSQL cannot subtract much more from
#: now(), and Python's datetime ends at year 9999.
CENTURY = 100 * 365.25 * DAY
#: The relay's Kafka timeout (seconds): its transaction timeout is twice this, which must stay
#: within the broker's transaction.max.timeout.ms (15 minutes by default).
MAX_KAFKA_TIMEOUT = 300.0
#: The longest a consumer's batch waits to fill up (ms), and a relay transaction takes claims.
MAX_BATCH_MS = 60_000.0
#: The most rows one retention DELETE takes (a batch is one transaction; the loop waits for it).
MAX_RETENTION_BATCH = 100_000
#: The most records in one consumer batch: one savepoint per handler, and PostgreSQL keeps 64
#: subtransactions per transaction in shared memory (more slow down every snapshot).
MAX_BATCH_RECORDS = 64
#: A claim's byte cap: the confluent producer's queue is sized from it (in kilobytes, a C int).
MAX_BATCH_BYTES = 1024 * 1024 * 1024
#: Integer values of Kafka client options: librdkafka keeps them in C ints (a larger Python int
#: is wrapped on the way in, so it could turn into another valid value); aiokafka writes its
#: timeouts into 32-bit request fields.
INT32 = (-(2**31), 2**31 - 1)

KafkaOption = Secret[str | int | float | bool]
SslPath = Annotated[Path | None, BeforeValidator(non_empty_path)]


class SecurityProtocol(StrEnum):
    PLAINTEXT = "PLAINTEXT"
    SSL = "SSL"
    SASL_PLAINTEXT = "SASL_PLAINTEXT"
    SASL_SSL = "SASL_SSL"


class SaslMechanism(StrEnum):
    PLAIN = "PLAIN"
    SCRAM_SHA_256 = "SCRAM-SHA-256"
    SCRAM_SHA_512 = "SCRAM-SHA-512"


class KafkaClient(StrEnum):
    CONFLUENT = "confluent"
    AIOKAFKA = "aiokafka"


class Mode(StrEnum):
    EXACTLY_ONCE = "exactly_once"
    AT_LEAST_ONCE = "at_least_once"


class OnPublish(StrEnum):
    MARK = "mark"
    DELETE = "delete"


class ParkedKeyPolicy(StrEnum):
    WAIT = "wait"
    SKIP = "skip"


def _strict(prefix: str) -> SettingsConfigDict:
    """Every section: unknown names refused, no NaN or infinity, and no input value in an
    error (pydantic would quote it, a password included)."""
    return SettingsConfigDict(
        env_prefix=prefix, extra="forbid", allow_inf_nan=False, hide_input_in_errors=True
    )


class DatabaseSettings(BaseSettings):
    """``OUTBOXKIT_DATABASE_URL``: a libpq URL; ``sslmode`` and friends pass through in it."""

    model_config = _strict("OUTBOXKIT_DATABASE_")

    url: SecretStr | None = None
    # false behind a pooler that cannot keep prepared statements (PgBouncer in transaction mode
    # before 1.21, or with max_prepared_statements = 0): psycopg prepares a statement it has run
    # 5 times on a connection, which such a pooler then runs on another server connection.
    prepared_statements: bool = True

    def connect_options(self) -> dict[str, Any]:
        """psycopg's keyword arguments for the connections outboxkit's processes open."""
        return {} if self.prepared_statements else {"prepare_threshold": None}


class KafkaSettings(BaseSettings):
    """Connection and security settings shared by every Kafka client (``OUTBOXKIT_KAFKA_*``).

    ``client`` picks the implementation (default: confluent-kafka when installed, else aiokafka).
    ``properties`` are extra librdkafka properties for the confluent-kafka client (their values
    are treated as secrets: a repr shows only their names); those the typed settings decide
    are refused (:mod:`outboxkit.settings.kafka_names`).
    """

    model_config = _strict("OUTBOXKIT_KAFKA_")

    bootstrap: str = ""
    client: KafkaClient | None = None
    client_id: str = "outboxkit"
    security_protocol: SecurityProtocol = SecurityProtocol.PLAINTEXT
    sasl_mechanism: SaslMechanism | None = None
    sasl_username: Annotated[str | None, AfterValidator(not_empty)] = None
    sasl_password: Annotated[SecretStr | None, AfterValidator(not_empty)] = None
    ssl_ca_location: SslPath = None
    ssl_certificate_location: SslPath = None
    ssl_key_location: SslPath = None
    ssl_key_password: SecretStr | None = None
    ssl_check_hostname: bool = True
    properties: Annotated[dict[str, SecretStr], NoDecode] = Field(default_factory=dict)

    @field_validator("properties", mode="before")
    @classmethod
    def _json_object(cls, value: Any) -> Any:
        if isinstance(value, str):  # from a variable: a JSON object of strings
            try:
                value = json.loads(value)
            except ValueError:
                raise ValueError("must be a JSON object of strings") from None
        return property_values(value)

    @field_serializer("properties")
    def _names_only(self, value: dict[str, SecretStr]) -> dict[str, str]:
        return dict.fromkeys(value, "**********")

    @model_validator(mode="after")
    def _security_fits(self) -> KafkaSettings:
        problem = security_problem(self) or kafka_names.properties_problem(self)
        if problem is not None:
            raise ValueError(problem)
        return self

    @classmethod
    def plaintext(cls, bootstrap: str) -> KafkaSettings:
        """A plaintext listener's settings, whatever ``OUTBOXKIT_KAFKA_*`` says (given values
        outrank the environment): SASL or TLS settings there would be refused beside it."""
        unset: dict[str, Any] = dict.fromkeys((*SASL_SETTINGS, *SSL_SETTINGS))
        return cls(
            bootstrap=bootstrap,
            security_protocol=SecurityProtocol.PLAINTEXT,
            properties={},
            **unset,
        )

    @property
    def uses_sasl(self) -> bool:
        return self.security_protocol in (
            SecurityProtocol.SASL_SSL,
            SecurityProtocol.SASL_PLAINTEXT,
        )

    @property
    def uses_tls(self) -> bool:
        return self.security_protocol in (SecurityProtocol.SSL, SecurityProtocol.SASL_SSL)


class RelaySettings(BaseSettings):
    """The relay process (``outboxkit relay run``), ``OUTBOXKIT_RELAY_*``.

    Bounds: the time spans in seconds (``poll_interval``, ``lease_ttl``,
    ``housekeeping_interval``, ``backoff_*``) at most a day, the retention windows at most a
    century, ``kafka_timeout`` at most 300 s, ``transaction_max_ms`` at most a minute,
    ``max_batch_bytes`` at most 1 GiB, ``retention_batch`` at most 100,000. Below:
    ``kafka_timeout`` and ``lease_ttl`` at least 1 s (a timeout under 1 ms is librdkafka's
    "no timeout"; a lease must outlive a renewal), ``poll_interval`` at least 10 ms (a busy loop).
    """

    model_config = _strict("OUTBOXKIT_RELAY_")

    group: Annotated[str, storable("the relay group")] = Field("default", min_length=1)
    # None: every shard of outbox_setting.shard_count. In a variable: "0,2".
    shards: Annotated[tuple[int, ...] | None, NoDecode] = None
    # Rows per claim: batch_size when the shard is drained (latency); while claims come back
    # full it doubles per claim up to max_batch_size (throughput; <= batch_size: fixed size).
    batch_size: int = Field(500, ge=1, le=10_000)
    max_batch_size: int = Field(2000, ge=1, le=10_000)
    # A claim also stops at this many bytes of payload, key and headers (>= 1 row): memory.
    max_batch_bytes: int = Field(16 * 1024 * 1024, ge=1024, le=MAX_BATCH_BYTES)
    # Exactly-once: transactional ids per shard, used in turn (one waits out the broker's
    # transaction markers while the other works; docs/tuning.md has the figures behind 2). A
    # takeover reads every slot's checkpoint up to MAX_PRODUCERS_PER_SHARD and fences every slot
    # an earlier holder recorded (relay/takeover.py): it may be lowered while relays run.
    producers_per_shard: int = Field(2, ge=1, le=MAX_PRODUCERS_PER_SHARD)
    # Under backlog one Kafka transaction (at-least-once: one database mark) carries several
    # claims, up to this many rows or until this many milliseconds passed since its first claim;
    # a claim that comes back short ends it at once, so an idle relay still sends each row
    # alone. transaction_max_ms = 0: one claim per transaction; no claim passes max_rows.
    # The rows' ids travel in the checkpoint record: 10,000 keep it far below 1 MB.
    transaction_max_rows: int = Field(5000, ge=1, le=10_000)
    transaction_max_ms: float = Field(100.0, ge=0, le=MAX_BATCH_MS)  # <= the transaction timeout
    # `relay run` only (an embedded relay leaves its host's collector alone): gc_tuning.py.
    gc_tuning: bool = True
    # The longest idle wait; pause/SIGTERM obey within it.
    poll_interval: float = Field(1.0, ge=0.01, le=DAY)
    # At most this many shards held by one process (None: every shard it watches); the others
    # are left to other processes. Bounds the process's data connections (one per held shard).
    max_shards_per_process: int | None = Field(None, ge=1)
    lease_ttl: float = Field(15.0, ge=1, le=DAY)
    mode: Mode = Mode.EXACTLY_ONCE
    on_publish: OnPublish = OnPublish.MARK
    parked_key_policy: ParkedKeyPolicy = ParkedKeyPolicy.WAIT
    checkpoint_topic: Annotated[str, AfterValidator(topic_name)] = "outboxkit.relay.checkpoint"
    retention_seconds: float | None = Field(86_400.0, ge=0, le=CENTURY)  # None ("forever") keeps
    retention_batch: int = Field(1000, ge=1, le=MAX_RETENTION_BATCH)
    # Housekeeping of rows that never publish: discarded rows after a week; parked rows only
    # when set (deleting a parked row gives up on it). Counted from when the row was parked.
    discarded_retention_seconds: float | None = Field(7 * 86_400.0, ge=0, le=CENTURY)
    parked_retention_seconds: float | None = Field(None, ge=0, le=CENTURY)
    housekeeping_interval: float = Field(600.0, gt=0, le=DAY)
    metrics_port: int | None = Field(None, ge=0, le=65_535)
    metrics_host: str = "127.0.0.1"  # the manifests set 0.0.0.0 inside a pod
    listen: bool = True
    backoff_initial: float = Field(0.2, gt=0, le=DAY)
    backoff_max: float = Field(5.0, gt=0, le=DAY)
    kafka_timeout: float = Field(30.0, ge=1, le=MAX_KAFKA_TIMEOUT)

    @field_validator("shards", mode="before")
    @classmethod
    def _comma_list(cls, value: Any) -> Any:
        if isinstance(value, str):
            parts = [part.strip() for part in value.split(",")]
            try:
                return tuple(int(part) for part in parts if part) or None
            except ValueError:  # int()'s message quotes the value
                raise ValueError("must be shard numbers separated by commas") from None
        return value

    @field_validator("shards")
    @classmethod
    def _non_negative(cls, value: tuple[int, ...] | None) -> tuple[int, ...] | None:
        if value is not None and any(shard < 0 for shard in value):
            raise ValueError("shard numbers must be non-negative")
        return value

    @field_validator(
        "retention_seconds",
        "discarded_retention_seconds",
        "parked_retention_seconds",
        "metrics_port",
        "max_shards_per_process",
        mode="before",
    )
    @classmethod
    def _off(cls, value: Any) -> Any:
        if isinstance(value, str) and value.strip().lower() in ("none", "forever", "off", ""):
            return None
        return value

    @model_validator(mode="after")
    def _backoff_order(self) -> RelaySettings:
        if self.backoff_initial > self.backoff_max:
            raise ValueError("backoff_initial must not exceed backoff_max")
        return self

    @property
    def lease_renew_interval(self) -> float:
        return self.lease_ttl / 3


class ConsumerSettings(BaseSettings):
    """The consumer process (``outboxkit inbox run``), ``OUTBOXKIT_CONSUMER_*``.

    ``registry`` and ``handler`` are ``module:attribute`` specs: the ``EventRegistry`` (with
    handlers registered by ``@registry.handler(...)``), and optionally one function for every
    event type without its own handler. ``topics`` is a comma-separated list or a JSON list.
    ``kafka_options`` are extra consumer properties in the client's own spelling; their values
    are treated as secrets (a repr, ``config show`` and the logs show only their names), integer
    values must fit 32 bits.
    ``retention_window`` (seconds, 0 = off): finished inbox rows and rejections older than this
    are purged by the running consumer every ``retention_interval`` seconds.
    ``batch_max_records`` records are processed in one transaction (savepoints per handler only
    when one fails; 1 turns batching off); a batch waits at most ``batch_max_ms`` to fill up.
    ``dead_letter`` is a topic name or a template whose only placeholder is ``{topic}``.
    Bounds: the time spans (``retry_delay``, ``lease_seconds``, ``offset_commit_interval``,
    ``retention_interval``) at most a day, the windows (``retention_window``, ``dedup_window``)
    at most a century, ``batch_max_ms`` at most a minute, ``name`` at most 255 UTF-8 bytes, no NUL.
    """

    model_config = _strict("OUTBOXKIT_CONSUMER_")

    name: Annotated[str | None, storable("the consumer name")] = None
    group: str | None = None
    topics: Annotated[list[str], NoDecode, AfterValidator(topic_list)] = Field(default_factory=list)
    registry: str | None = None
    handler: str | None = None
    max_attempts: int = Field(default=5, ge=1)
    retry_delay: float = Field(default=0.5, ge=0, le=DAY)
    lease_seconds: float = Field(default=30.0, gt=0, le=DAY)
    dead_letter: Annotated[str | None, AfterValidator(dead_letter_template)] = "{topic}.dlq"
    acks_topic: Annotated[str, AfterValidator(topic_name)] | None = None
    offset_commit_interval: float = Field(default=0.0, ge=0, le=DAY)
    metrics_port: int | None = Field(default=None, ge=0, le=65_535)
    metrics_host: str = "127.0.0.1"
    dedup_window: float | None = Field(default=None, gt=0, le=CENTURY)
    dead_letter_check: Literal["fail", "warn", "off"] = "fail"
    retention_window: float = Field(default=7 * 24 * 3600.0, ge=0, le=CENTURY)
    retention_interval: float = Field(default=60.0, gt=0, le=DAY)
    max_unexpected_errors: int = Field(default=5, ge=1)
    error_detail: bool = False
    batch_max_records: int = Field(default=50, ge=1, le=MAX_BATCH_RECORDS)
    batch_max_ms: float = Field(default=5.0, ge=0, le=MAX_BATCH_MS)
    gc_tuning: bool = True  # `inbox run` only: the collector settings of gc_tuning.py
    kafka_options: Annotated[dict[str, KafkaOption], NoDecode] = Field(default_factory=dict)

    @field_validator("kafka_options", mode="before")
    @classmethod
    def _options_json(cls, value: Any) -> Any:
        if isinstance(value, str):  # from a variable: a JSON object
            try:
                return json.loads(value)
            except ValueError:
                raise ValueError("must be a JSON object (its text is not shown)") from None
        return value

    @field_validator("kafka_options")
    @classmethod
    def _int32_options(cls, value: dict[str, KafkaOption]) -> dict[str, KafkaOption]:
        problem = text_problem(value, options=True)
        if problem is not None:
            raise ValueError(problem)
        low, high = INT32
        for name, option in value.items():
            number = option.get_secret_value()
            if type(number) is int and not low <= number <= high:
                raise ValueError(f"{name!r}: Kafka clients keep integers in 32 bits")
        return value

    def client_options(self) -> dict[str, str | int | float | bool]:
        """``kafka_options`` as the Kafka client takes them (the values themselves)."""
        return {name: option.get_secret_value() for name, option in self.kafka_options.items()}

    @field_validator("topics", mode="before")
    @classmethod
    def _split_topics(cls, value: object) -> object:
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                return json.loads(text)
            return [t.strip() for t in text.split(",") if t.strip()]
        return value

    def missing(self) -> list[str]:
        """The variables ``outboxkit inbox run`` needs that are not set."""
        needed = {"name": self.name, "group": self.group, "topics": self.topics}
        needed["registry"] = self.registry or self.handler
        return [f"OUTBOXKIT_CONSUMER_{k.upper()}" for k, v in needed.items() if not v]
