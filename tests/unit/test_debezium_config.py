"""The Debezium side-by-side benchmark's configuration: templates render, parse, and map the
outbox EventRouter onto columns that exist in outboxkit's table (the benchmark itself is run by
hand with ``make bench-debezium``)."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from benchmarks.debezium import config
from benchmarks.debezium.jars import DEBEZIUM_VERSION, HERE
from outboxkit.devstack import KAFKA_VERSION

ROOT = Path(__file__).resolve().parents[2]
POM_NS = {"m": "http://maven.apache.org/POM/4.0.0"}


def outbox_columns() -> set[str]:
    """Column names of ``outbox_message`` as the first migration creates them."""
    sql = (ROOT / "migrations" / "0001_outbox.sql").read_text()
    body = re.search(r"CREATE TABLE outbox_message \((.*?)\n\);", sql, re.S)
    assert body is not None
    names = set()
    for line in body.group(1).splitlines():
        word = line.strip().split(" ", 1)[0]
        if word and word.upper() != "CONSTRAINT" and not word.startswith("--"):
            names.add(word)
    return names


def rendered_connector(poll_interval_ms: int = 10) -> dict[str, str]:
    return config.connector_config(
        name="outbox-test",
        db_port=54321,
        db_user="outboxkit",
        db_password="s3cret",
        db_name="bench_db",
        slot="bench_slot",
        publication="bench_pub",
        poll_interval_ms=poll_interval_ms,
    )


def test_outbox_columns_are_read_from_the_migration() -> None:
    columns = outbox_columns()
    assert {"id", "event_id", "topic", "message_key", "payload", "headers"} <= columns
    assert "CONSTRAINT" not in columns
    assert len(columns) > 20


def test_worker_properties_render_and_listen_on_loopback_only(tmp_path: Path) -> None:
    text = config.worker_properties(
        bootstrap="127.0.0.1:9092",
        rest_port=18083,
        plugin_path=tmp_path / "plugins",
        offsets_file=tmp_path / "offsets.dat",
    )
    assert "{{" not in text
    props = config.parse_properties(text)
    assert props["bootstrap.servers"] == "127.0.0.1:9092"
    assert props["listeners"] == "http://127.0.0.1:18083"
    assert props["rest.advertised.host.name"] == "127.0.0.1"
    assert props["plugin.path"] == str(tmp_path / "plugins")
    assert props["offset.storage.file.filename"] == str(tmp_path / "offsets.dat")
    # The payload and key pass through unchanged, as outboxkit's relay sends them.
    assert props["value.converter"].endswith("ByteArrayConverter")
    assert props["key.converter"].endswith("StringConverter")


def test_connector_maps_the_event_router_onto_existing_outbox_columns() -> None:
    props = rendered_connector()
    assert props["transforms"] == "outbox"
    assert props["transforms.outbox.type"] == "io.debezium.transforms.outbox.EventRouter"
    mapped = config.router_columns(props)
    assert mapped["table.field.event.id"] == "event_id"
    assert mapped["table.field.event.key"] == "message_key"
    assert mapped["table.field.event.payload"] == "payload"
    assert mapped["route.by.field"] == "topic"
    assert set(mapped.values()) <= outbox_columns(), set(mapped.values()) - outbox_columns()
    excluded = props["column.exclude.list"].split(",")
    assert all(c.removeprefix("outboxkit.outbox_message.") in outbox_columns() for c in excluded)
    # The routed topic is the row's own topic column, Debezium's placeholder left for Debezium.
    assert props["transforms.outbox.route.topic.replacement"] == "${routedByValue}"


def test_connector_streams_the_outbox_table_with_pgoutput_and_no_snapshot() -> None:
    props = rendered_connector(poll_interval_ms=10)
    assert props["connector.class"] == "io.debezium.connector.postgresql.PostgresConnector"
    assert props["plugin.name"] == "pgoutput"
    assert props["snapshot.mode"] == "no_data"
    assert props["table.include.list"] == "outboxkit.outbox_message"
    assert props["publication.autocreate.mode"] == "disabled"
    assert (props["slot.name"], props["publication.name"]) == ("bench_slot", "bench_pub")
    assert (props["database.port"], props["database.dbname"]) == ("54321", "bench_db")
    assert props["poll.interval.ms"] == "10"
    assert props["name"] == props["topic.prefix"] == "outbox-test"


def test_default_poll_interval_is_debeziums_default() -> None:
    assert rendered_connector(config.DEFAULT_POLL_INTERVAL_MS)["poll.interval.ms"] == "500"


def test_render_refuses_missing_and_unknown_placeholders() -> None:
    with pytest.raises(config.TemplateError, match="missing"):
        config.render("a={{one}}\nb={{two}}", {"one": 1})
    with pytest.raises(config.TemplateError, match="unknown"):
        config.render("a={{one}}", {"one": 1, "three": 3})
    assert config.render("a={{one}} ${kept}", {"one": 1}) == "a=1 ${kept}"


@pytest.mark.parametrize("text", ["no separator here", "a=1\na=2", "=value", "a=line\\", "a\\.b=1"])
def test_parse_properties_refuses_what_it_does_not_understand(text: str) -> None:
    with pytest.raises(config.TemplateError):
        config.parse_properties(text)


def test_parse_properties_skips_comments_and_keeps_equals_in_values() -> None:
    props = config.parse_properties("# c\n! c\n\n key = a=b \n")
    assert props == {"key": "a=b"}


def pom_property(name: str, prop: str) -> str:
    root = ET.parse(HERE / name).getroot()
    node = root.find(f"m:properties/m:{prop}", POM_NS)
    assert node is not None
    assert node.text
    return node.text


def test_poms_pin_the_broker_and_debezium_versions() -> None:
    assert pom_property("pom-connect.xml", "kafka.version") == KAFKA_VERSION
    assert pom_property("pom-debezium.xml", "debezium.version") == DEBEZIUM_VERSION


def test_distributed_worker_has_exactly_once_source_support_on_loopback(tmp_path: Path) -> None:
    props = config.parse_properties(
        config.distributed_worker_properties(
            bootstrap="127.0.0.1:9092", rest_port=18084, plugin_path=tmp_path, group="g1"
        )
    )
    assert props["exactly.once.source.support"] == "enabled"
    assert props["listeners"] == "http://127.0.0.1:18084"
    assert props["group.id"] == "g1"
    topics = [props[f"{kind}.storage.topic"] for kind in ("config", "offset", "status")]
    assert len(set(topics)) == 3
    assert all(t.startswith("g1.") for t in topics)
    assert all(
        props[f"{kind}.storage.replication.factor"] == "1"
        for kind in ("config", "offset", "status")
    )


def test_exactly_once_connector_requires_it_and_keeps_the_router() -> None:
    plain = rendered_connector()
    props = config.connector_config(
        name="outbox-test",
        db_port=54321,
        db_user="outboxkit",
        db_password="s3cret",
        db_name="bench_db",
        slot="bench_slot",
        publication="bench_pub",
        poll_interval_ms=10,
        exactly_once=True,
    )
    assert props["exactly.once.support"] == "required"
    assert props["transaction.boundary"] == "poll"
    assert {k: v for k, v in props.items() if k not in config.EXACTLY_ONCE_SETTINGS} == plain
    assert "exactly.once.support" not in plain
