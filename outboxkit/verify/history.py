"""The recorded history of one ``outboxkit verify`` run, and its JSON form.

A run is judged after the fact from this record alone, so everything the checker needs is here:
what writers were told, what a ``read_committed`` reader found in Kafka, what consumers left in
the database, the fencing tokens seen over time and the faults injected. Keeping the record
separate from the run means a failing seed can be re-checked (and the checker tested) without
PostgreSQL or Kafka. The JSON carries ``"format": 1`` so an old file is refused, not misread.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pydantic import ConfigDict, TypeAdapter
from pydantic import ValidationError as PydanticValidationError

from outboxkit.errors import OutboxkitError

FORMAT = 1

# The inbox states after which a (consumer, event) is settled; "processing" is the only other one.
INBOX_TERMINAL_STATES = frozenset({"succeeded", "dead", "rejected", "cancelled"})
INBOX_SUCCEEDED = "succeeded"

_STRICT_FIELDS = ConfigDict(extra="forbid")  # a misspelt or newer field is an error, not dropped


class HistoryFormatError(OutboxkitError):
    """The history file is not a valid outboxkit verify history of a known format."""


class WriteOutcome(enum.StrEnum):
    """What the writer learned about one outbox write once its transaction ended.

    The outcome is the transaction's, not the call's: a write that returned "duplicate" or
    raised the conflict error inside a transaction that then rolled back is ``rolled_back``.
    """

    COMMITTED = "committed"  # a new row committed: it must reach Kafka
    ROLLED_BACK = "rolled_back"  # the transaction rolled back: it must never reach Kafka
    DUPLICATE = "duplicate"  # same idempotency key, same content: no new row, existing id returned
    REJECTED = "rejected"  # same idempotency key, other content: refused with an error
    # The commit's result never arrived (connection lost during COMMIT, server restarted). The
    # row may or may not exist, so neither its presence nor its absence in Kafka is an anomaly.
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class TopicSpec:
    __pydantic_config__: ClassVar[ConfigDict] = _STRICT_FIELDS

    name: str
    partitions: int


@dataclass(frozen=True)
class ConsumerSpec:
    """A consumer name (the inbox ``consumer`` column); every event on its topics is its work."""

    __pydantic_config__: ClassVar[ConfigDict] = _STRICT_FIELDS

    name: str
    topics: tuple[str, ...]
    clients: tuple[str, ...] = ()  # e.g. ("confluent", "aiokafka"): which libraries ran it
    processes: int = 1


@dataclass(frozen=True)
class RunParams:
    """Everything needed to re-run the same seed against the same shape of deployment."""

    __pydantic_config__: ClassVar[ConfigDict] = _STRICT_FIELDS

    seed: int
    mode: str  # the relay's mode: "exactly_once" or "at_least_once"
    duration_s: float
    writers: int
    relays: int
    relay_group: str
    shards: int
    topics: tuple[TopicSpec, ...]
    consumers: tuple[ConsumerSpec, ...]
    stack: str = "external"  # or "self-started": only then may the broker and database restart
    options: dict[str, str | int | float | bool] = field(default_factory=dict)


@dataclass(frozen=True)
class WriteOp:
    """One outbox write attempt and its outcome, as the writing application saw it.

    ``seq`` is the per-(topic, key) sequence number assigned inside the writing transaction (for
    example by incrementing a counter row for the key), so it is the key's commit order: rows
    with the same key serialise on that counter. ``None`` when the writer did not assign one.
    ``existing_event_id`` is the id the outbox returned for a duplicate.
    """

    __pydantic_config__: ClassVar[ConfigDict] = _STRICT_FIELDS

    writer: str
    event_id: str
    idempotency_key: str
    topic: str
    key: str | None
    digest: str  # hex content digest (outboxkit.wire.content_digest)
    outcome: WriteOutcome
    seq: int | None = None
    existing_event_id: str | None = None
    time: float = 0.0  # seconds since the run started, when the outcome was learned


@dataclass(frozen=True)
class KafkaRecord:
    """One record read back from Kafka by a ``read_committed`` reader after the run."""

    __pydantic_config__: ClassVar[ConfigDict] = _STRICT_FIELDS

    topic: str
    partition: int
    offset: int
    key: str | None
    event_id: str | None  # the event-id header; None when the header was missing
    seq: int | None = None  # the per-key sequence carried in the payload, when decodable


@dataclass(frozen=True)
class ConsumerEffect:
    """How many times a consumer's handler effect for one event is present in the database."""

    __pydantic_config__: ClassVar[ConfigDict] = _STRICT_FIELDS

    consumer: str
    event_id: str
    count: int


@dataclass(frozen=True)
class InboxState:
    """Inbox rows found for one (consumer, event) in one state; ``rows`` counts them."""

    __pydantic_config__: ClassVar[ConfigDict] = _STRICT_FIELDS

    consumer: str
    event_id: str
    state: str
    rows: int = 1


@dataclass(frozen=True)
class RelayTokenObservation:
    """A relay lease token seen for (group, shard); list order is observation order."""

    __pydantic_config__: ClassVar[ConfigDict] = _STRICT_FIELDS

    group: str
    shard: int
    token: int
    time: float = 0.0
    observer: str = ""

    @property
    def lease(self) -> str:
        return f"relay {self.group}/{self.shard}"


@dataclass(frozen=True)
class InboxTokenObservation:
    """An inbox lease token seen for (consumer, event); list order is observation order."""

    __pydantic_config__: ClassVar[ConfigDict] = _STRICT_FIELDS

    consumer: str
    event_id: str
    token: int
    time: float = 0.0
    observer: str = ""

    @property
    def lease(self) -> str:
        return f"inbox {self.consumer}/{self.event_id}"


@dataclass(frozen=True)
class Fault:
    """One fault the nemesis injected: ``kind`` such as sigkill, sigstop, rebalance, pg_restart."""

    __pydantic_config__: ClassVar[ConfigDict] = _STRICT_FIELDS

    kind: str
    target: str
    time: float
    detail: str = ""


@dataclass
class History:
    """The whole record of one run. Mutable so a recorder can append as the run goes."""

    __pydantic_config__: ClassVar[ConfigDict] = _STRICT_FIELDS

    params: RunParams
    writes: list[WriteOp] = field(default_factory=list)
    kafka: list[KafkaRecord] = field(default_factory=list)
    effects: list[ConsumerEffect] = field(default_factory=list)
    inbox: list[InboxState] = field(default_factory=list)
    relay_tokens: list[RelayTokenObservation] = field(default_factory=list)
    inbox_tokens: list[InboxTokenObservation] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)

    def to_json(self) -> str:
        """Stable text: the same history always gives the same bytes (keys sorted, compact)."""
        data: dict[str, Any] = _ADAPTER.dump_python(self, mode="json")
        data["format"] = FORMAT
        try:
            return json.dumps(data, sort_keys=True, separators=(",", ":"), allow_nan=False)
        except ValueError as exc:  # NaN or infinity in a float field has no JSON form
            raise HistoryFormatError(f"history cannot be written as JSON: {exc}") from exc

    @classmethod
    def from_json(cls, text: str | bytes) -> History:
        """The history in ``text``, or a :class:`HistoryFormatError` of one line, whatever the
        bytes (deep nesting included): a file to re-check may come from anywhere."""
        try:
            data = json.loads(text, parse_constant=_refuse_constant)
        except ValueError as exc:
            raise HistoryFormatError(f"history is not valid JSON: {exc}") from exc
        except RecursionError:
            raise HistoryFormatError("history is not valid JSON: nested too deeply") from None
        if not isinstance(data, dict):
            raise HistoryFormatError("history JSON must be an object")
        version = data.pop("format", None)
        if version != FORMAT:
            shown = version if isinstance(version, int) and not isinstance(version, bool) else "?"
            raise HistoryFormatError(
                f"history format {shown} is not supported (this version reads {FORMAT})"
            )
        try:
            return _ADAPTER.validate_python(data)
        except PydanticValidationError as exc:
            first = exc.errors()[0]
            where = ascii(".".join(str(part) for part in first["loc"]))[1:-1][:200] or "top"
            raise HistoryFormatError(
                f"history does not match format {FORMAT}: {exc.error_count()} error(s), the"
                f" first at {where}: {first['msg']}"
            ) from exc
        except RecursionError:
            raise HistoryFormatError("history is nested too deeply for its format") from None


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed in a history")


_ADAPTER: TypeAdapter[History] = TypeAdapter(History)
