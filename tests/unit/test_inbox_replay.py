"""``inbox replay``'s decisions: which dead letters count, what each row state means, and the
order of the delete and the publish. No Kafka, no database: records and effects are made here."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from outboxkit.errors import PublishError
from outboxkit.inbox.replay import (
    CHANGING,
    FAILED,
    NOT_ALLOWED,
    REPLAYED,
    UNUSABLE,
    WOULD_REPLAY,
    DeadLetter,
    Outcome,
    Replay,
    Seen,
    Step,
    Unusable,
    decide,
    read_dead_letter,
    replay_one,
    source_of,
    source_topic,
    targets,
    unusable_outcome,
)
from outboxkit.kafka.api import ConsumedRecord
from outboxkit.schema import InboxState

SECRET = b"s3cret-token"


def dead_letter(
    event_id: str | bytes | None = "e1",
    consumer: str | bytes | None = "billing",
    source: str | bytes | None = "payments/2/17",
    *,
    offset: int = 0,
    value: bytes | None = b'{"amount": 1}',
    extra: tuple[tuple[str, bytes | None], ...] = (),
    header_error: str | None = None,
) -> ConsumedRecord:
    def raw(v: str | bytes) -> bytes:
        return v.encode() if isinstance(v, str) else v

    headers: list[tuple[str, bytes | None]] = [
        ("event-id", b"e1"),
        ("traceparent", b"00-abc-01"),
        ("authorization", SECRET),
        ("dlq-error", b"boom " + SECRET),
        ("dlq-attempts", b"5"),
    ]
    for name, v in (("dlq-event-id", event_id), ("dlq-consumer", consumer), ("dlq-source", source)):
        if v is not None:
            headers.append((name, raw(v)))
    headers.extend(extra)
    if header_error is not None:
        headers = []
    return ConsumedRecord("payments.dlq", 0, offset, b"key", value, tuple(headers), 1, header_error)


# --- decide ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("state", "step"),
    [
        (None, Step.SKIP_NO_ROW),
        (InboxState.DEAD, Step.FORGET_THEN_PUBLISH),
        (InboxState.CANCELLED, Step.SKIP_CANCELLED),
        (InboxState.SUCCEEDED, Step.SKIP_SUCCEEDED),
        (InboxState.PROCESSING, Step.SKIP_PROCESSING),
        (InboxState.REJECTED, Step.SKIP_REJECTED),
    ],
)
def test_each_row_state_has_its_step(state: InboxState | None, step: Step) -> None:
    assert decide(state) is step


def test_no_row_is_published_only_when_told() -> None:
    """No row is a replay that stopped after its delete, or a row purged after its event ran:
    published again, that one would run twice."""
    assert decide(None, publish_missing=True) is Step.PUBLISH
    assert {decide(s, publish_missing=True) for s in InboxState} == {decide(s) for s in InboxState}


def test_every_state_is_decided() -> None:
    every = {decide(s) for s in InboxState} | {decide(None, publish_missing=b) for b in (0, 1)}
    assert every == set(Step)


# --- reading a dead letter ------------------------------------------------------------------


def test_a_dead_letter_gives_back_the_original_record_without_dlq_headers() -> None:
    found = read_dead_letter(dead_letter(), "billing")
    assert isinstance(found, DeadLetter)
    assert found.event_id == "e1"
    assert found.source_topic == "payments"
    assert found.where == "payments.dlq/0/0"
    assert (found.key, found.value) == (b"key", b'{"amount": 1}')
    assert found.headers == (
        ("event-id", b"e1"),
        ("traceparent", b"00-abc-01"),
        ("authorization", SECRET),
    )


def test_another_consumers_dead_letter_is_not_ours() -> None:
    assert read_dead_letter(dead_letter(consumer="shipping"), "billing") is None


def test_event_ids_filter() -> None:
    assert read_dead_letter(dead_letter(), "billing", {"e2"}) is None
    assert isinstance(read_dead_letter(dead_letter(), "billing", {"e1", "e2"}), DeadLetter)


@pytest.mark.parametrize(
    ("record", "reason", "event_id"),
    [
        (dead_letter(header_error="x"), "headers unreadable (a header name is not UTF-8)", None),
        (dead_letter(consumer=None), "no dlq-consumer header", None),
        (dead_letter(consumer=b"\xff\xfe"), "dlq-consumer header not valid UTF-8", None),
        (dead_letter(event_id=None), "no dlq-event-id header", None),
        (dead_letter(event_id=b"\xc3("), "dlq-event-id header not valid UTF-8", None),
        (
            dead_letter(event_id=b"a\x1b[2J"),
            "dlq-event-id header contains control characters",
            None,
        ),
        (dead_letter(event_id=b""), "empty dlq-event-id header", None),
        (dead_letter(source=None), "no dlq-source header", "e1"),
        (dead_letter(source="payments"), "dlq-source header is not topic/partition/offset", "e1"),
        (dead_letter(source=b"\xff/0/1"), "dlq-source header not valid UTF-8", "e1"),
        (dead_letter(value=None), "no value (a tombstone)", "e1"),
        (
            dead_letter(extra=(("dlq-consumer", b"billing"),)),
            "dlq-consumer header given 2 times",
            None,
        ),
        (
            dead_letter(extra=(("dlq-consumer", None),)),
            "dlq-consumer header given 2 times",
            None,
        ),
    ],
)
def test_an_unusable_dead_letter_is_reported_without_its_values(
    record: ConsumedRecord, reason: str, event_id: str | None
) -> None:
    found = read_dead_letter(record, "billing")
    assert found == Unusable("payments.dlq/0/0", event_id, reason)
    outcome = unusable_outcome(found)
    assert outcome.action == UNUSABLE
    assert SECRET.decode() not in repr(outcome)


@pytest.mark.parametrize(
    ("text", "topic"),
    [
        ("payments/0/0", "payments"),
        ("a.b_c-D9/12/123456789", "a.b_c-D9"),
        ("payments/0", None),
        ("payments/0/1/2", None),
        ("payments/-1/0", None),
        ("payments/0/x", None),
        ("payments/0/", None),
        ("/0/0", None),
        ("../0/0", None),
        ("pay ments/0/0", None),
        ("pay\nments/0/0", None),
        ("t" * 250 + "/0/0", None),
        ("payments/٣/0", None),  # a digit, not an ASCII one
        ("payments/1" + "0" * 19 + "/0", None),
    ],
)
def test_source_topic(text: str, topic: str | None) -> None:
    assert source_topic(text) == topic


# --- a run, record by record ---------------------------------------------------------------


def run_over(
    records: list[ConsumedRecord],
    *,
    to_topics: tuple[str, ...] = (),
    dlq: str = "payments.dlq",
    limit: int = 100,
    state: InboxState | None = InboxState.DEAD,
    publish_missing: bool = False,
) -> tuple[Replay, list[Outcome], list[str]]:
    """A run over ``records`` whose rows are all in ``state``; what it published, in order."""
    published: list[str] = []

    def publish(letter: DeadLetter) -> None:
        published.append(f"{letter.event_id}->{letter.source_topic}")

    run = Replay(
        "billing",
        None,
        targets(dlq, to_topics),
        state_of=lambda e: state,
        forget=lambda e: True,
        publish=publish,
        limit=limit,
        publish_missing=publish_missing,
    )
    outcomes = [o for o in map(run.handle, records) if o is not None]
    return run, outcomes, published


def test_each_event_is_acted_on_once_in_order_read() -> None:
    records = [
        dead_letter("e2", offset=0),
        dead_letter("e1", offset=1),
        dead_letter("e2", offset=2),
        dead_letter("e3", consumer="shipping", offset=3),
    ]
    run, outcomes, published = run_over(records)
    assert [(o.event_id, o.where, o.action) for o in outcomes] == [
        ("e2", "payments.dlq/0/0", REPLAYED),
        ("e1", "payments.dlq/0/1", REPLAYED),
    ]
    assert published == ["e2->payments", "e1->payments"]
    assert (run.repeats, run.others, dict(run.counts)) == (1, 1, {REPLAYED: 2})


def test_a_usable_dead_letter_read_after_an_unusable_one_still_replays() -> None:
    records = [dead_letter("e1", source="bad", offset=0), dead_letter("e1", offset=1)]
    _, outcomes, published = run_over(records)
    assert [(o.where, o.action) for o in outcomes] == [
        ("payments.dlq/0/0", UNUSABLE),
        ("payments.dlq/0/1", REPLAYED),
    ]
    assert published == ["e1->payments"]


def test_unusable_dead_letters_reported_once_per_event_and_each_nameless_one() -> None:
    records = [
        dead_letter("e1", source="bad", offset=0),
        dead_letter("e1", source="worse", offset=1),
        dead_letter(consumer=None, offset=2),
        dead_letter(consumer=None, offset=3),
        dead_letter("e2", offset=4),
    ]
    run, outcomes, _ = run_over(records)
    assert [(o.event_id, o.where, o.action) for o in outcomes] == [
        ("e1", "payments.dlq/0/0", UNUSABLE),
        (None, "payments.dlq/0/2", UNUSABLE),
        (None, "payments.dlq/0/3", UNUSABLE),
        ("e2", "payments.dlq/0/4", REPLAYED),
    ]
    assert run.repeats == 1


# --- where a replay may publish -------------------------------------------------------------


@pytest.mark.parametrize(
    ("dlq", "source"),
    [
        ("payments.dlq", "payments"),
        ("a.b.dlq", "a.b"),
        ("payments", None),
        (".dlq", None),
        ("payments.dlq.x", None),
        ("payments-dlq", None),
    ],
)
def test_the_source_topic_follows_from_the_default_template(dlq: str, source: str | None) -> None:
    assert source_of(dlq) == source


def test_a_record_naming_another_topic_is_never_published() -> None:
    """Whoever can write to the dead-letter topic names the target: only the allowed go."""
    records = [
        dead_letter("e1", source="payments/0/1", offset=0),
        dead_letter("e2", source="admin-commands/0/1", offset=1),
    ]
    _, outcomes, published = run_over(records)
    assert published == ["e1->payments"]
    assert outcomes[1].action == NOT_ALLOWED
    assert outcomes[1].detail == (
        "dlq-source names a topic other than 'payments' (pass --to-topic to allow others)"
        " (dlq-source topic 'admin-commands')"
    )


def test_to_topic_allows_exactly_the_topics_given() -> None:
    records = [
        dead_letter("e1", source="payments/0/1", offset=0),
        dead_letter("e2", source="refunds/0/1", offset=1),
    ]
    _, outcomes, published = run_over(records, to_topics=("refunds",))
    assert published == ["e2->refunds"]
    assert [o.action for o in outcomes] == [NOT_ALLOWED, REPLAYED]


def test_without_the_suffix_or_to_topic_nothing_is_published_and_the_operator_is_told() -> None:
    _, outcomes, published = run_over([dead_letter()], dlq="billing-dead")
    assert published == []
    (outcome,) = outcomes
    assert outcome.action == NOT_ALLOWED
    assert outcome.detail is not None
    assert "pass --to-topic" in outcome.detail
    assert "'.dlq'" in outcome.detail


def test_a_forged_dead_letter_naming_another_topic_does_not_block_the_real_one() -> None:
    records = [
        dead_letter("e1", source="elsewhere/0/1", offset=0),
        dead_letter("e1", source="elsewhere/0/2", offset=1),
        dead_letter("e1", source="payments/0/1", offset=2),
    ]
    run, outcomes, published = run_over(records)
    assert [o.action for o in outcomes] == [NOT_ALLOWED, REPLAYED]
    assert published == ["e1->payments"]
    assert run.repeats == 1


def test_a_dead_row_is_not_deleted_for_a_topic_not_allowed() -> None:
    effects = Effects(InboxState.DEAD)
    run = Replay(
        "billing",
        None,
        targets("payments.dlq", ()),
        state_of=effects.state_of,
        forget=effects.forget,
        publish=effects.publish,
    )
    outcome = run.handle(dead_letter(source="other/0/0"))
    assert outcome is not None
    assert outcome.action == NOT_ALLOWED
    assert effects.log == []  # not even looked up


# --- memory: bounded by a setting, not by the topic -----------------------------------------


def test_seen_keeps_at_most_its_limit_of_fixed_size_digests() -> None:
    seen = Seen(2)
    for event_id in ("a" * 1000, "b", "c", "d"):
        seen.put(event_id, True)
    assert (seen.get("a" * 1000), seen.get("b"), seen.get("c")) == (True, True, None)
    assert seen.full == 2
    seen.put("b", False)  # a remembered one can still change
    assert seen.get("b") is False


def test_past_the_bound_a_further_dead_letter_is_decided_by_its_row() -> None:
    """A replayed event not yet handled has no row: skipped, or with --publish-missing
    published again, which the consumer skips as a duplicate; nothing more is held."""
    records = [
        dead_letter("e1", offset=0),
        dead_letter("e2", offset=1),
        dead_letter("e2", offset=2),
    ]
    run, _, published = run_over(records, limit=1, state=None, publish_missing=True)
    assert published == ["e1->payments", "e2->payments", "e2->payments"]
    assert run.seen.full == 2
    run, outcomes, published = run_over(records, limit=1, state=None)
    assert published == []
    assert [o.action for o in outcomes] == ["skipped-no-row"] * 3


def test_records_are_acted_on_as_they_are_read_not_gathered_first() -> None:
    """A stream of any length: each record is decided (and published) before the next is
    read, and the records are not kept."""
    published: list[str] = []
    seen_when_read: list[int] = []

    def stream() -> Iterator[ConsumedRecord]:
        for n in range(1000):
            seen_when_read.append(len(published))
            yield dead_letter(f"e{n}", offset=n)

    run = Replay(
        "billing",
        None,
        targets("payments.dlq", ()),
        state_of=lambda e: InboxState.DEAD,
        forget=lambda e: True,
        publish=lambda letter: published.append(letter.event_id),
        limit=10,
    )
    for record in stream():
        run.handle(record)
    assert seen_when_read == list(range(1000))
    assert len(published) == 1000
    assert run.seen.full == 990


# --- replaying one --------------------------------------------------------------------------


class Effects:
    """Row states and what was done, in order."""

    def __init__(self, state: InboxState | None, *, later: InboxState | None = None) -> None:
        self.state = state
        self.later = later  # the state a lookup after a refused delete finds
        self.log: list[str] = []
        self.fail_publish = False

    def state_of(self, event_id: str) -> InboxState | None:
        self.log.append(f"look {event_id}")
        return self.state

    def forget(self, event_id: str) -> bool:
        self.log.append(f"delete {event_id}")
        if self.later is not None or self.state is not InboxState.DEAD:
            self.state = self.later
            return False
        self.state = None
        return True

    def publish(self, letter: DeadLetter) -> None:
        self.log.append(f"publish {letter.event_id} to {letter.source_topic}")
        if self.fail_publish:
            raise PublishError("publish to 'payments' failed: NOT_ENOUGH_REPLICAS: try later")

    def replay(
        self, *, dry_run: bool = False, publish_missing: bool = False
    ) -> tuple[str, str | None]:
        letter = read_dead_letter(dead_letter(), "billing")
        assert isinstance(letter, DeadLetter)
        out = replay_one(
            letter,
            state_of=self.state_of,
            forget=self.forget,
            publish=self.publish,
            dry_run=dry_run,
            publish_missing=publish_missing,
        )
        return out.action, out.detail


def test_a_dead_event_is_deleted_first_then_published() -> None:
    effects = Effects(InboxState.DEAD)
    assert effects.replay() == (REPLAYED, "to payments")
    assert effects.log == ["look e1", "delete e1", "publish e1 to payments"]


def test_an_event_without_a_row_is_published_only_when_told() -> None:
    effects = Effects(None)
    assert effects.replay() == ("skipped-no-row", None)
    assert effects.log == ["look e1"]
    effects.log = []
    assert effects.replay(publish_missing=True) == (REPLAYED, "to payments")
    assert effects.log == ["look e1", "publish e1 to payments"]


@pytest.mark.parametrize(
    "state",
    [InboxState.CANCELLED, InboxState.SUCCEEDED, InboxState.PROCESSING, InboxState.REJECTED],
)
def test_other_states_change_nothing(state: InboxState) -> None:
    effects = Effects(state)
    assert effects.replay() == (f"skipped-{state.value}", None)
    assert effects.log == ["look e1"]


@pytest.mark.parametrize("state", [InboxState.DEAD, None])
def test_a_dry_run_only_looks(state: InboxState | None) -> None:
    effects = Effects(state)
    action, detail = effects.replay(dry_run=True, publish_missing=True)
    assert action == WOULD_REPLAY
    assert detail == ("dead row" if state else "no row")
    assert effects.log == ["look e1"]


def test_a_row_that_changed_before_the_delete_is_decided_again() -> None:
    """Another replay deleted it (no row: publish) or the consumer runs it already (skip)."""
    gone = Effects(InboxState.DEAD)

    def deleted_by_another(event_id: str) -> bool:
        gone.log.append(f"delete {event_id}")
        gone.state = None
        return False

    gone.forget = deleted_by_another  # type: ignore[method-assign]
    assert gone.replay() == ("skipped-no-row", None)  # the other replay publishes it
    assert gone.log == ["look e1", "delete e1", "look e1"]
    gone.state, gone.log = InboxState.DEAD, []
    assert gone.replay(publish_missing=True) == (REPLAYED, "to payments")
    assert gone.log == ["look e1", "delete e1", "look e1", "publish e1 to payments"]

    running = Effects(InboxState.DEAD, later=InboxState.PROCESSING)
    assert running.replay() == ("skipped-processing", None)
    assert running.log == ["look e1", "delete e1", "look e1"]


def test_a_row_that_keeps_turning_dead_is_given_up() -> None:
    effects = Effects(InboxState.DEAD, later=InboxState.DEAD)
    assert effects.replay() == (CHANGING, "its row changed while replaying")
    assert "publish e1 to payments" not in effects.log


def test_a_failed_publish_is_reported_and_the_row_stays_deleted() -> None:
    effects = Effects(InboxState.DEAD)
    effects.fail_publish = True
    action, detail = effects.replay()
    assert action == FAILED
    assert detail is not None
    assert "NOT_ENOUGH_REPLICAS" in detail
    assert detail.endswith(
        "its dead row is deleted: run the replay again with --publish-missing --event-id e1"
        " to publish it"
    )
    assert effects.state is None  # the next run finds no row: published when told
    assert Effects(effects.state).replay() == ("skipped-no-row", None)
    assert Effects(effects.state).replay(publish_missing=True) == (REPLAYED, "to payments")
