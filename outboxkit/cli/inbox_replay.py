"""``outboxkit inbox replay``: re-drive one consumer's dead events from its dead-letter topic.

A thin driver: the topic is read through the Kafka seam a record at a time, rows are looked up
and deleted through :mod:`outboxkit.inbox.readback`, and every decision is
:mod:`outboxkit.inbox.replay`'s. Each outcome is printed as it happens (``--json`` too: the
document is written as it goes), so neither the records nor the outcomes pile up in memory.
Nothing it prints quotes a payload, a key or a header value other than the event id and the
``dlq-source`` topic (a name Kafka accepts).
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import asdict
from typing import Any

import click

from outboxkit.cli.inbox_common import consumer_name, engine_for, json_option, printable
from outboxkit.cli.options import database_options, key_value_items
from outboxkit.errors import ConfigurationError, PublishError, named
from outboxkit.inbox.readback import event_state, forget_dead
from outboxkit.inbox.replay import DeadLetter, Outcome, Replay, source_topic, targets
from outboxkit.kafka import KafkaClients
from outboxkit.kafka.readback import TopicReadback
from outboxkit.schema import InboxState
from outboxkit.settings import KafkaClient, KafkaSettings, load_kafka_settings


def _kafka(
    config_path: str | None, bootstrap: str | None, client: str | None, items: tuple[str, ...]
) -> KafkaSettings:
    """The ``[kafka]`` settings, ``--bootstrap``, ``--kafka-client`` and ``--kafka-option``
    winning (the options' properties added to the settings' own)."""
    given: dict[str, Any] = {"bootstrap": bootstrap, "client": client}
    try:
        settings = load_kafka_settings(config_path, overrides={"kafka": given})
        if items:
            kept = {k: v.get_secret_value() for k, v in settings.properties.items()}
            given["properties"] = {**kept, **dict(key_value_items(items, "--kafka-option"))}
            settings = load_kafka_settings(config_path, overrides={"kafka": given})
    except ConfigurationError as exc:  # names the settings, never echoes their values
        raise click.ClickException(str(exc)) from None
    if not settings.bootstrap:
        raise click.UsageError(
            "Kafka bootstrap servers are required (--bootstrap, OUTBOXKIT_KAFKA_BOOTSTRAP or"
            " [kafka] bootstrap)"
        )
    return settings


def _topics(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> tuple[str, ...]:
    for number, topic in enumerate(value, start=1):
        if source_topic(f"{topic}/0/0") != topic:
            raise click.BadParameter(f"item {number} is not a topic name Kafka accepts")
    return value


def _line(outcome: Outcome) -> str:
    shown = "-" if outcome.event_id is None else printable(outcome.event_id)
    text = f"{shown}  {outcome.action}  (dead letter {printable(outcome.where)})"
    return text if outcome.detail is None else f"{text}: {printable(outcome.detail)}"


class _Report:
    """The output, written as the run goes: a line per outcome and a summary line, or one JSON
    document whose ``events`` are written one by one (``error``: why the run stopped early)."""

    def __init__(self, as_json: bool, consumer: str, topic: str, dry_run: bool) -> None:
        self._json, self._consumer, self._topic = as_json, consumer, topic
        self._first = True
        if as_json:
            head = {"consumer": consumer, "dead_letter_topic": topic, "dry_run": dry_run}
            click.echo(json.dumps(head, indent=2)[:-2] + ',\n  "events": [', nl=False)

    def event(self, outcome: Outcome) -> None:
        if not self._json:
            click.echo(_line(outcome))
            return
        click.echo(("\n    " if self._first else ",\n    ") + json.dumps(asdict(outcome)), nl=False)
        self._first = False

    def end(self, run: Replay, error: str | None = None) -> None:
        counts = dict(sorted(run.counts.items()))
        if self._json:
            summary = {**counts, "repeated_dead_letters": run.repeats}
            summary["not_remembered"] = run.seen.full
            tail: dict[str, Any] = {"summary": summary}
            if error is not None:
                tail["error"] = error
            close = json.dumps(tail, indent=2)[1:]  # the document goes on after "events"
            click.echo(("\n  ]," if not self._first else "],") + close)
            return
        parts = ", ".join(f"{n} {action}" for action, n in counts.items())
        extra = ""
        if run.seen.full:
            extra = f"; {run.seen.full} dead letters of events past --remember"
        click.echo(
            f"{printable(self._consumer)}: {sum(counts.values())} dead events on"
            f" {printable(self._topic)} ({parts or 'none'}; {run.repeats} repeated dead"
            f" letters{extra})"
        )


def _sender(kafka: TopicReadback) -> None:
    """The producer, before any row is deleted: one that cannot start ends the command with
    nothing changed."""
    try:
        kafka.start_sender()
    except Exception as exc:  # any client's error: nothing was changed yet
        raise click.ClickException(f"the Kafka producer cannot start: {named(exc)}") from None


@click.command()
@database_options
@click.option("--bootstrap", help="Kafka bootstrap servers (default: the settings').")
@click.option(
    "--kafka-client",
    type=click.Choice([c.value for c in KafkaClient]),
    help="Kafka client library ($OUTBOXKIT_KAFKA_CLIENT; default: confluent if installed).",
)
@click.option(
    "--kafka-option",
    "kafka_items",
    multiple=True,
    help="librdkafka property key=value (confluent-kafka; aiokafka warns and ignores it).",
)
@json_option
@click.option("--consumer", required=True, callback=consumer_name, help="Whose dead events.")
@click.option("--dead-letter-topic", "topic", required=True, help="The topic to read them from.")
@click.option(
    "--to-topic",
    "to_topics",
    multiple=True,
    callback=_topics,
    help="A topic records may be published to (repeatable). Default: only S when the"
    " dead-letter topic is S.dlq, else none. A record whose dlq-source names any other topic"
    " is skipped-topic-not-allowed.",
)
@click.option("--event-id", "event_ids", multiple=True, help="Only this event (repeatable).")
@click.option("--dry-run", is_flag=True, help="Show what would be replayed; change nothing.")
@click.option(
    "--publish-missing",
    is_flag=True,
    help="Also publish events that have no inbox row: one whose replay stopped between deleting"
    " its row and publishing (the failed line says so). Without it they are skipped-no-row: no"
    " row also means a row purged after its event ran, which would run twice.",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=1, max=3600),
    default=60.0,
    show_default=True,
    help="Seconds to wait for the topic's next record (or its end), and for each publish.",
)
@click.option(
    "--remember",
    type=click.IntRange(min=1, max=10_000_000),
    default=100_000,
    show_default=True,
    help="Event ids kept to act on each event once (about 100 bytes each). Past it, a further"
    " dead letter of an event not kept is decided by its row alone.",
)
def replay(
    config_path: str | None,
    database_url: str | None,
    schema: str | None,
    bootstrap: str | None,
    kafka_client: str | None,
    kafka_items: tuple[str, ...],
    as_json: bool,
    consumer: str,
    topic: str,
    to_topics: tuple[str, ...],
    event_ids: tuple[str, ...],
    dry_run: bool,
    publish_missing: bool,
    timeout: float,
    remember: int,
) -> None:
    """Replay a consumer's dead events from the dead-letter topic, each once.

    Reads the topic from its start to its end (read_committed, no consumer group) and acts on
    each dead letter of the consumer (header dlq-consumer) as it is read, by the event's inbox
    row: dead, the row is deleted and then the original record (its key, value and headers, no
    dlq-* header) published to the topic it came from (dlq-source), waiting for the broker; no
    row (deleted by a replay that stopped, or purged), it is published only with
    --publish-missing; cancelled, succeeded, processing or rejected, it is skipped. Only the
    topics allowed are published to: the --to-topic ones, else S for a dead-letter topic named
    S.dlq; a dead letter naming another is skipped-topic-not-allowed (its row untouched).
    Exit 1 when a publish failed (the event's row is gone: run again with --publish-missing
    --event-id E) or the read stopped early; 0 otherwise."""
    wanted = frozenset(event_ids) or None
    allowed = targets(topic, to_topics)
    with engine_for(config_path, database_url, schema) as (engine, schema_name):
        settings = _kafka(config_path, bootstrap, kafka_client, kafka_items)
        clients = KafkaClients(settings, timeout=timeout)
        with engine.connect():  # meet the database (wrong URL, server away) before the read
            pass

        def state_of(event_id: str) -> InboxState | None:
            return event_state(engine, consumer, event_id, schema=schema_name)

        def forget(event_id: str) -> bool:
            return forget_dead(engine, consumer, event_id, schema=schema_name)

        with clients.topic_readback() as kafka:

            def publish(letter: DeadLetter) -> None:
                try:
                    kafka.send(letter.source_topic, letter.key, letter.value, letter.headers)
                except PublishError:
                    raise
                except Exception as exc:  # the row may be gone: said as a failed publish
                    raise PublishError(f"publish to {letter.source_topic!r}: {named(exc)}") from exc

            run = Replay(
                consumer,
                wanted,
                allowed,
                state_of,
                forget,
                publish,
                dry_run,
                remember,
                publish_missing,
            )
            _run(kafka, run, topic, as_json, dry_run)
    if run.failed:
        raise click.exceptions.Exit(1)


def _run(kafka: TopicReadback, run: Replay, topic: str, as_json: bool, dry_run: bool) -> None:
    """Read and act, record by record. A read that fails after records were read still ends
    with the summary of what was done (then the error, exit 1)."""
    if not dry_run:
        _sender(kafka)
    report: _Report | None = None
    read = 0
    try:
        with contextlib.closing(kafka.records(topic)) as records:
            for record in records:
                if report is None:
                    report = _Report(as_json, run.consumer, topic, dry_run)
                read += 1
                outcome = run.handle(record)
                if outcome is not None:
                    report.event(outcome)
    except PublishError as exc:  # the read's (a publish's is an outcome)
        if report is not None:
            report.end(run, error=f"the read stopped after {read} records: {exc}")
        raise click.ClickException(f"reading {topic!r}: {exc}") from None
    except BaseException:
        if report is not None:
            report.end(run, error="stopped by an error (see it below)")
        raise
    if report is None:
        report = _Report(as_json, run.consumer, topic, dry_run)
    report.end(run)
