"""Every example in examples/ runs against the real services and does what its README says.

Each example is loaded as its README runs it: as a script, with its own folder first on
``sys.path`` (the folders start with a number, so they are not importable packages). Examples
that need events in Kafka get them the way their README says: written by example 02 and
published by example 07. Each run uses its own topic (``EXAMPLE_TOPIC``) and a fresh database.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import sys
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import Any

import psycopg
import pytest

from outboxkit import ConfigurationError
from outboxkit.kafka.config import aiokafka_options, confluent_config
from outboxkit.settings import KafkaSettings

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TESTED_ELSEWHERE = {"06_batched_consumer"}  # has its own test file


def load(folder: str, script: str) -> ModuleType:
    """The script as a fresh module (it reads EXAMPLE_TOPIC when loaded)."""
    path = EXAMPLES / folder / f"{script}.py"
    name = f"example_{folder}_{script}"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # SQLAlchemy resolves the models' annotations through it
    sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(path.parent))
    return module


def tables(url: str) -> set[str]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT table_schema || '.' || table_name FROM information_schema.tables"
            " WHERE table_schema IN ('public', 'outboxkit')"
        ).fetchall()
    return {row[0] for row in rows}


async def published_orders(db_url: str, bootstrap: str) -> list[str]:
    """Orders written by example 02 and published by example 07; returns the order ids."""
    summary = load("02_sync_script", "place_orders").main(db_url, count=3)
    states = await load("07_embedded_relay", "embedded_relay").main(db_url, bootstrap)
    assert states == Counter(published=len(summary.order_ids))
    return list(summary.order_ids)


async def run_01(request: pytest.FixtureRequest) -> None:
    from fastapi.testclient import TestClient
    from sqlalchemy import create_engine, make_url
    from sqlalchemy.orm import Session

    from outboxkit.testing import assert_outboxed

    db_url = request.getfixturevalue("outboxkit_db_url")
    example = load("01_fastapi_service", "orders_api")
    with TestClient(example.create_app(db_url)) as client:

        def place(key: str, customer: str = "ada", total: int = 1250) -> Any:
            return client.post(
                "/orders",
                json={"customer": customer, "total_cents": total},
                headers={"Idempotency-Key": key},
            )

        first = place("k1")
        assert first.status_code == 201
        retry = place("k1")
        assert (retry.status_code, retry.json()) == (200, first.json())
        assert place("k1", customer="bob").status_code == 409  # same key, other content
        assert place("k2", total=10**7).status_code == 422  # over the limit: rolled back
        assert client.get(f"/orders/{uuid.uuid5(example.ORDER_IDS, 'k2')}").status_code == 404
        order_id = place("k3").json()["id"]
        cancelled = client.post(f"/orders/{order_id}/cancel", json={"reason": "changed mind"})
        assert cancelled.json()["status"] == "cancelled"
        assert client.post(f"/orders/{order_id}/cancel", json={"reason": "x"}).status_code == 409

    engine = create_engine(make_url(db_url).set(drivername="postgresql+psycopg"))
    try:
        with Session(engine) as session:
            assert_outboxed(session, event_type="order.placed", count=2)
            assert_outboxed(session, event_type="order.placed", key=first.json()["id"], count=1)
            [placed, cancel] = assert_outboxed(session, key=order_id, count=2)
            assert (placed.event_type, cancel.event_type) == ("order.placed", "order.cancelled")
            assert placed.id < cancel.id  # the relay publishes them in this order
            assert cancel.json() == {"order_id": order_id, "reason": "changed mind"}
    finally:
        engine.dispose()


async def run_02(request: pytest.FixtureRequest) -> None:
    summary = load("02_sync_script", "place_orders").main(
        request.getfixturevalue("outboxkit_db_url"), count=4
    )
    assert len(summary.order_ids) == 4 + 3  # placed one by one, then the bulk import
    assert summary.events == len(summary.order_ids)  # one event per order; none for the rollback
    assert summary.retry_was_duplicate
    assert summary.conflict_refused


async def run_03(request: pytest.FixtureRequest) -> None:
    url = request.getfixturevalue("outboxkit_empty_db_url")
    example = load("03_alembic", "migrate_app")
    assert example.main(url) == 1
    found = tables(url)
    assert {"public.alembic_version", "public.example_invoice"} <= found
    assert {"outboxkit.outbox_message", "outboxkit.inbox_message"} <= found
    assert not {"outboxkit.example_invoice", "outboxkit.alembic_version"} & found
    assert example.main(url) == 2  # again: nothing to migrate, autogenerate still clean


async def run_consumer(request: pytest.FixtureRequest, *, example: tuple[str, str]) -> None:
    """Examples 04 and 05: every event applied once, then every replayed one a duplicate."""
    db_url = request.getfixturevalue("outboxkit_db_url")
    bootstrap = request.getfixturevalue("outboxkit_kafka_bootstrap")
    orders = await published_orders(db_url, bootstrap)
    result = load(*example).main(db_url, KafkaSettings(bootstrap=bootstrap), expected=len(orders))
    passes, per_order = await result if inspect.isawaitable(result) else result
    assert passes == [Counter(succeeded=len(orders)), Counter(duplicate=len(orders))]
    assert per_order == dict.fromkeys(orders, 1)


async def run_09(request: pytest.FixtureRequest) -> None:
    """The batch handler books every order once; the 0-cent order of the bulk import fails the
    bulk call, then goes dead alone."""
    db_url = request.getfixturevalue("outboxkit_db_url")
    bootstrap = request.getfixturevalue("outboxkit_kafka_bootstrap")
    orders = await published_orders(db_url, bootstrap)
    free = {o for o in orders if o.endswith("-import-0")}
    example = load("09_batch_handler", "revenue_consumer")
    report = await example.main(db_url, KafkaSettings(bootstrap=bootstrap), expected=len(orders))
    assert report.outcomes == Counter(succeeded=len(orders) - 1, dead=1)
    assert report.lines == set(orders) - free
    assert report.revenue == {"ada": (3, 1500), "import": (2, 1 + 2)}
    assert max(report.call_sizes) > 1  # in bulk
    assert sum(report.call_sizes) > len(orders)  # and one by one after the failed bulk call


async def run_07(request: pytest.FixtureRequest) -> None:
    # published_orders runs example 07 and checks every row of the topic ended published.
    await published_orders(
        request.getfixturevalue("outboxkit_db_url"),
        request.getfixturevalue("outboxkit_kafka_bootstrap"),
    )


async def run_08(request: pytest.FixtureRequest) -> None:
    """The TOML file + variables + a secret file, against the SASL_SSL broker of the dev stack:
    example 07's relay publishes and example 04's consumer reads with these settings only."""
    monkeypatch = request.getfixturevalue("monkeypatch")
    listener = request.getfixturevalue("outboxkit_secure_kafka").sasl_ssl
    db_url = request.getfixturevalue("outboxkit_db_url")
    secrets = request.getfixturevalue("tmp_path")
    (secrets / "OUTBOXKIT_KAFKA_SASL_PASSWORD").write_text(listener.password + "\n")
    for name, value in {
        "OUTBOXKIT_SECRETS_DIR": str(secrets),
        "OUTBOXKIT_DATABASE_URL": db_url,
        "OUTBOXKIT_KAFKA_BOOTSTRAP": listener.bootstrap,  # the TOML file names the brokers
        "OUTBOXKIT_KAFKA_SASL_USERNAME": listener.username,
        "OUTBOXKIT_KAFKA_SSL_CA_LOCATION": listener.ca_location,
    }.items():
        monkeypatch.setenv(name, value)
    example = load("08_secured_kafka", "show_settings")
    shown = example.main()
    assert listener.password not in shown
    assert json.loads(shown)["sasl_password"] == "**********"
    settings = example.load()
    kafka = settings.kafka
    assert settings.relay.group == "orders"  # from the TOML file
    librdkafka = confluent_config(kafka)
    assert {k: librdkafka[k] for k in ("security.protocol", "sasl.mechanism", "sasl.password")} == {
        "security.protocol": "sasl_ssl",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.password": listener.password,
    }
    assert aiokafka_options(kafka)["security_protocol"] == "SASL_SSL"

    relay = load("07_embedded_relay", "embedded_relay")
    await relay.create_topics(kafka, relay.TOPIC, f"{relay.TOPIC}.dlq")
    orders = load("02_sync_script", "place_orders").main(db_url, count=2).order_ids
    assert await relay.publish_pending(settings) == Counter(published=len(orders))
    consumer = load("04_consumer_confluent", "shipping_consumer")
    passes, per_order = consumer.main(db_url, kafka, expected=len(orders))
    assert passes[0] == Counter(succeeded=len(orders))
    assert per_order == dict.fromkeys(orders, 1)

    monkeypatch.delenv("OUTBOXKIT_SECRETS_DIR")
    with pytest.raises(ConfigurationError, match="OUTBOXKIT_KAFKA_SASL_PASSWORD"):
        example.load()


RUNNERS: dict[str, Callable[[pytest.FixtureRequest], Awaitable[None]]] = {
    "01_fastapi_service": run_01,
    "02_sync_script": run_02,
    "03_alembic": run_03,
    "04_consumer_confluent": partial(
        run_consumer, example=("04_consumer_confluent", "shipping_consumer")
    ),
    "05_consumer_aiokafka": partial(
        run_consumer, example=("05_consumer_aiokafka", "loyalty_consumer")
    ),
    "07_embedded_relay": run_07,
    "08_secured_kafka": run_08,
    "09_batch_handler": run_09,
}


@pytest.fixture
def example_topic(monkeypatch: pytest.MonkeyPatch) -> str:
    topic = f"example-{uuid.uuid4().hex[:10]}"
    monkeypatch.setenv("EXAMPLE_TOPIC", topic)
    # Each test's database is another outbox: on the suite's one Kafka cluster, relays of the
    # default group sharing the default checkpoint topic would find each other's checkpoints
    # (and stop, as they must), so each example's relay gets a checkpoint topic of its own.
    monkeypatch.setenv("OUTBOXKIT_RELAY_CHECKPOINT_TOPIC", f"outboxkit.cp.{topic}")
    return topic


@pytest.mark.parametrize("folder", sorted(RUNNERS))
async def test_example(folder: str, example_topic: str, request: pytest.FixtureRequest) -> None:
    await RUNNERS[folder](request)


def test_every_example_has_a_readme_and_a_test() -> None:
    folders = {path.name for path in EXAMPLES.glob("[0-9][0-9]_*") if path.is_dir()}
    assert folders - TESTED_ELSEWHERE == set(RUNNERS)
    for folder in folders:
        assert (EXAMPLES / folder / "README.md").is_file(), folder
