"""``outboxkit inbox replay``: re-drive one consumer's dead events from its dead-letter topic.

A thin driver: the topic is read through the Kafka seam, rows are looked up and deleted through
:mod:`outboxkit.inbox.readback`, and every decision is :mod:`outboxkit.inbox.replay`'s. Nothing
it prints quotes a payload, a key or a header value other than the event id.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict
from typing import Any

import click

from outboxkit.cli.inbox_common import consumer_name, engine_for, json_option, printable
from outboxkit.cli.options import database_options
from outboxkit.errors import ConfigurationError, PublishError
from outboxkit.inbox.readback import event_state, forget_dead
from outboxkit.inbox.replay import (
    FAILED,
    DeadLetter,
    Outcome,
    read_dead_letter,
    replay_one,
    select,
    unusable_outcome,
)
from outboxkit.kafka import KafkaClients
from outboxkit.schema import InboxState
from outboxkit.settings import KafkaSettings, load_kafka_settings


def _kafka_properties(items: tuple[str, ...]) -> dict[str, str]:
    """``--kafka-option key=value`` items (librdkafka properties); an error names the item,
    never its text (a value may be a secret)."""
    properties: dict[str, str] = {}
    for number, item in enumerate(items, start=1):
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise click.BadParameter(
                f"item {number} of {len(items)} is not key=value (its text is not shown)",
                param_hint="'--kafka-option'",
            )
        properties[name] = value
    return properties


def _kafka(config_path: str | None, bootstrap: str | None, items: tuple[str, ...]) -> KafkaSettings:
    """The ``[kafka]`` settings, ``--bootstrap`` and ``--kafka-option`` winning (the options'
    properties added to the settings' own)."""
    given: dict[str, Any] = {"bootstrap": bootstrap}
    try:
        settings = load_kafka_settings(config_path, overrides={"kafka": given})
        if items:
            kept = {k: v.get_secret_value() for k, v in settings.properties.items()}
            given["properties"] = {**kept, **_kafka_properties(items)}
            settings = load_kafka_settings(config_path, overrides={"kafka": given})
    except ConfigurationError as exc:  # names the settings, never echoes their values
        raise click.ClickException(str(exc)) from None
    if not settings.bootstrap:
        raise click.UsageError(
            "Kafka bootstrap servers are required (--bootstrap, OUTBOXKIT_KAFKA_BOOTSTRAP or"
            " [kafka] bootstrap)"
        )
    return settings


def _line(outcome: Outcome) -> str:
    shown = "-" if outcome.event_id is None else printable(outcome.event_id)
    text = f"{shown}  {outcome.action}  (dead letter {printable(outcome.where)})"
    return text if outcome.detail is None else f"{text}: {printable(outcome.detail)}"


@click.command()
@database_options
@click.option("--bootstrap", help="Kafka bootstrap servers (default: the settings').")
@click.option("--kafka-option", "kafka_items", multiple=True, help="librdkafka property key=value.")
@json_option
@click.option("--consumer", required=True, callback=consumer_name, help="Whose dead events.")
@click.option("--dead-letter-topic", "topic", required=True, help="The topic to read them from.")
@click.option("--event-id", "event_ids", multiple=True, help="Only this event (repeatable).")
@click.option("--dry-run", is_flag=True, help="Show what would be replayed; change nothing.")
@click.option(
    "--timeout",
    type=click.FloatRange(min=1, max=3600),
    default=60.0,
    show_default=True,
    help="Seconds to read the topic to its end, and for each publish.",
)
def replay(
    config_path: str | None,
    database_url: str | None,
    schema: str | None,
    bootstrap: str | None,
    kafka_items: tuple[str, ...],
    as_json: bool,
    consumer: str,
    topic: str,
    event_ids: tuple[str, ...],
    dry_run: bool,
    timeout: float,
) -> None:
    """Replay a consumer's dead events from the dead-letter topic, each once.

    Reads the topic from its start to its end (read_committed); for each dead letter of the
    consumer (header dlq-consumer), by the event's inbox row: dead, the row is deleted and
    then the original record (its key, value and headers, no dlq-* header) published to the
    topic it came from (dlq-source), waiting for the broker; no row (purged, or deleted by a
    replay that stopped), it is published; cancelled, succeeded, processing or rejected, it is
    skipped. Exit 1 when a publish failed: run it again (no row then means publish)."""
    wanted = frozenset(event_ids) or None
    with engine_for(config_path, database_url, schema) as (engine, schema_name):
        clients = KafkaClients(_kafka(config_path, bootstrap, kafka_items), timeout=timeout)
        with engine.connect():  # meet the database (wrong URL, server away) before the read
            pass
        try:
            records = clients.read_topic(
                topic, keep=lambda r: read_dead_letter(r, consumer, wanted) is not None
            )
        except PublishError as exc:
            raise click.ClickException(f"reading {topic!r}: {exc}") from None
        chosen = select(records, consumer, wanted)

        def state_of(event_id: str) -> InboxState | None:
            return event_state(engine, consumer, event_id, schema=schema_name)

        def forget(event_id: str) -> bool:
            return forget_dead(engine, consumer, event_id, schema=schema_name)

        sender = None if dry_run else clients.record_sender()

        def publish(letter: DeadLetter) -> None:
            assert sender is not None
            sender.send(letter.source_topic, letter.key, letter.value, letter.headers)

        outcomes = [unusable_outcome(u) for u in chosen.unusable]
        if not as_json:
            for outcome in outcomes:
                click.echo(_line(outcome))
        try:
            for letter in chosen.letters:
                outcome = replay_one(
                    letter, state_of=state_of, forget=forget, publish=publish, dry_run=dry_run
                )
                outcomes.append(outcome)
                if not as_json:
                    click.echo(_line(outcome))
        finally:
            if sender is not None:
                sender.close()
    counts = Counter(o.action for o in outcomes)
    if as_json:
        summary = {**counts, "repeated_dead_letters": chosen.repeats}
        document = {
            "consumer": consumer,
            "dead_letter_topic": topic,
            "dry_run": dry_run,
            "events": [asdict(o) for o in outcomes],
            "summary": summary,
        }
        click.echo(json.dumps(document, indent=2))
    else:
        parts = ", ".join(f"{n} {action}" for action, n in sorted(counts.items()))
        click.echo(
            f"{printable(consumer)}: {len(outcomes)} dead events on {printable(topic)}"
            f" ({parts or 'none'}; {chosen.repeats} repeated dead letters)"
        )
    if counts[FAILED]:
        raise click.exceptions.Exit(1)
