"""Two outboxes (two databases) whose relays share a group and a checkpoint topic.

Checkpoint keys are ``<group>/<shard>``: the second relay read the first one's checkpoint as its
own at its takeover, so a batch of its own that committed in Kafka without its mark would be
sent again, and rows the other checkpoint names would be marked published unsent. Checkpoints
now carry their outbox's identity (``outbox_setting.outbox_id``); a relay that finds another
outbox's under its key publishes nothing on that shard and says why.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterator

import psycopg
import pytest
from psycopg import sql

from outboxkit.devstack.postgres import database_url_with
from outboxkit.errors import PublishError
from outboxkit.relay.checkpoint import CHECKPOINT_TOPIC_CONFIG, Checkpoint
from outboxkit.settings import Settings
from tests.relay_support import (
    KAFKA_CLIENTS,
    consume,
    insert_rows,
    payloads,
    relay_settings,
    row_states,
    running_relay,
)
from tests.support.waiting import wait_for_async

pytestmark = pytest.mark.integration


@pytest.fixture
def other_db_url(outboxkit_database_url: str, outboxkit_template_database: str) -> Iterator[str]:
    """A second migrated database on the same server: another outbox."""
    name = f"outboxkit_other_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(outboxkit_database_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                sql.Identifier(name), sql.Identifier(outboxkit_template_database)
            )
        )
    url = database_url_with(outboxkit_database_url, name)
    with psycopg.connect(url, autocommit=True) as conn:  # a clone keeps the template's id
        conn.execute("UPDATE outboxkit.outbox_setting SET outbox_id = gen_random_uuid()")
    try:
        yield url
    finally:
        with psycopg.connect(outboxkit_database_url, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


@pytest.mark.parametrize("client", KAFKA_CLIENTS)
async def test_a_relay_refuses_another_outboxs_checkpoint_under_its_key(
    outboxkit_db_url: str,
    other_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: Callable[..., str],
    caplog: pytest.LogCaptureFixture,
    client: str,
) -> None:
    checkpoints = outboxkit_topic("cp", partitions=1, config=dict(CHECKPOINT_TOPIC_CONFIG))
    first, second = outboxkit_topic(partitions=1), outboxkit_topic(partitions=1)

    def settings(url: str) -> Settings:
        return relay_settings(
            url,
            outboxkit_kafka_bootstrap,
            client=client,
            mode="exactly_once",
            checkpoint_topic=checkpoints,
        )

    insert_rows(outboxkit_db_url, first, payloads("a", 3))
    async with running_relay(settings(outboxkit_db_url)):
        await wait_for_async(
            lambda: row_states(outboxkit_db_url) == {"published": 3}, what="the first outbox"
        )
    insert_rows(other_db_url, second, payloads("b", 2))
    caplog.set_level(logging.WARNING, logger="outboxkit.relay")
    async with running_relay(settings(other_db_url)):
        await wait_for_async(
            lambda: any("another outbox" in r.getMessage() for r in caplog.records),
            what="the second relay refusing the first one's checkpoint",
        )
        assert row_states(other_db_url) == {"pending": 2}
    [said, *_] = [r.getMessage() for r in caplog.records if "another outbox" in r.getMessage()]
    assert "key 'default/0'" in said, said
    assert "OUTBOXKIT_RELAY_GROUP" in said, said
    assert len(consume(outboxkit_kafka_bootstrap, first, expect=3)) == 3
    assert consume(outboxkit_kafka_bootstrap, second, expect=0, timeout=5, quiet=1) == []


def test_a_checkpoint_keeps_its_outbox_identity_and_older_ones_have_none() -> None:
    written = Checkpoint("g", 0, 7, ((1, str(uuid.uuid4())),), partitions=1, outbox="abc")
    assert Checkpoint.decode("g", 0, written.encode()) == written
    older = b'{"token": 1, "ids": [], "event_ids": []}'
    assert Checkpoint.decode("g", 0, older).outbox == ""
    with pytest.raises(PublishError, match="outbox identity"):
        Checkpoint.decode("g", 0, b'{"token": 1, "ids": [], "event_ids": [], "outbox": 5}')
