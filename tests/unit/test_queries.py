"""The query loader: every statement loads, compiles to psycopg's placeholders, and takes exactly
the parameters its callers pass; fragments are inserted; written mistakes are refused.

The integration test ``test_db_seam.py`` PREPAREs every statement on the real server.
"""

from __future__ import annotations

import re

import pytest

from outboxkit.db import queries
from outboxkit.db.queries import AREAS, Query, _check
from outboxkit.events import Message
from outboxkit.outbox_plan import OutboxConfig, Plan, prepare
from outboxkit.testing import _statement as outboxed_statement

RELAY_WRITES = (
    "mark_published",
    "reconcile_published",
    "reconcile_deleted",
    "delete_published",
    "park",
    "record_failure",
    "retention_delete",
    "housekeeping_delete_discarded",
    "housekeeping_delete_parked",
    "park_stray",
    "schedule_rows",
    "hold_rows",
    "held_orphans_release",
)
_FENCE = {"group", "shard", "token"}
_FENCED = _FENCE | {"now"}  # a fenced write: its lease check takes the clock too (tests)
_INBOX_KEY = {"consumer", "event_id"}
_ONE = {
    "event_id", "idempotency_key", "content_digest", "topic", "message_key", "payload",
    "content_type", "headers", "event_type", "schema_version", "aggregate_type", "aggregate_id",
    "deliver_after",
}  # fmt: skip
_MANY = {
    "event_ids", "idempotency_keys", "content_digests", "topics", "message_keys", "payloads",
    "content_types", "headers", "event_types", "schema_versions", "aggregate_types",
    "aggregate_ids", "deliver_afters",
}  # fmt: skip
_NOTIFY = {"channel", "notified_xact", "notified_shards"}

# The parameters each statement takes, i.e. what its callers pass. Changing a statement's
# parameters means changing its callers: this table makes that a conscious step.
PARAMETERS: dict[str, dict[str, set[str]]] = {
    "outbox": {
        "insert_one": _ONE | _NOTIFY,
        "insert_one_silent": _ONE,
        "insert_many": _MANY | _NOTIFY,
        "insert_many_silent": _MANY,
        "select_by_idempotency_keys": {"idempotency_keys"},
        "copy_lock": set(),
        "copy_setting": {"rows"},
        "copy_rows": set(),
        "copy_rows_default_ids": set(),
        "copied_ids": {"after_id"},
        "copied_ids_by_event_id": {"event_ids"},
        "notify_shards": {"shards"} | _NOTIFY,
        "select_outboxed": {"event_type", "message_key", "topic", "aggregate_id"},
        "state_counts": set(),
    },
    "relay": {
        "shard_count": set(),
        "outbox_identity": set(),
        "probe": set(),
        "lease_acquire": {"group", "shard", "holder", "ttl", "now"},
        "lease_renew_many": {"group", "holder", "shards", "tokens", "ttl", "now"},
        "lease_release": _FENCE,
        "lease_state": {"group", "shards", "now"},
        "claim_batch": {"shard", "skip_parked_keys", "in_flight", "limit", "max_bytes", "now"},
        "producer_slots_raise": _FENCED | {"slots"},
        "producer_slots_fenced": _FENCED | {"slots"},
        "mark_published": _FENCED | {"ids"},
        "reconcile_published": _FENCED | {"ids", "event_ids"},
        "reconcile_deleted": _FENCED | {"ids", "event_ids"},
        "delete_published": _FENCED | {"ids"},
        "park": _FENCED | {"id", "reason"},
        "record_failure": _FENCED | {"ids", "error"},
        "retention_delete": _FENCED | {"keep_seconds", "limit"},
        "housekeeping_delete_discarded": _FENCED | {"keep_seconds", "limit"},
        "housekeeping_delete_parked": _FENCED | {"keep_seconds", "limit"},
        "park_stray": _FENCED | {"limit"},
        "schedule_rows": _FENCED | {"limit", "ahead_seconds"},
        "parked_lock": {"name", "shard"},
        "parked_try_lock": {"name", "shard"},
        "parked_shards": {"all", "ids"},
        "hold_rows": _FENCED | {"limit", "window", "skip_parked_keys"},
        "held_keys_walk": {"shard", "after", "limit", "skip_parked_keys"},
        "held_orphans_release": _FENCED | {"keys", "limit", "skip_parked_keys"},
        "shards_lock_timeout": set(),
        "shards_lock_table": set(),
        "shards_blockers": set(),
        "shards_set": {"count"},
        "control_paused": {"group"},
        "control_set": {"group", "paused", "reason", "changed_by"},
        "holders": {"group", "holder", "now"},
        "status": {"group", "holder", "only", "now"},
        "pending_walk_only": set(),
        "parked_list": {"limit"},
        "parked_retry": {"all", "ids", "shards"},
        "held_release": {"shards"},
        "parked_discard": {"all", "ids", "shards"},
        "listen": set(),
    },
    "inbox": {
        "claim": _INBOX_KEY | {
            "idempotency_key", "content_digest", "event_type", "owner", "lease_seconds", "topic",
            "kafka_partition", "kafka_offset", "now",
        },
        "claim_batch": {
            "consumer", "event_ids", "idempotency_keys", "content_digests", "event_types",
            "owner", "lease_seconds", "topics", "kafka_partitions", "kafka_offsets", "now",
        },
        "release_batch": {"consumer", "event_ids", "tokens", "now"},
        "release_stopped_batch": {"consumer", "event_ids", "tokens", "now"},
        "mark_succeeded_batch": {"consumer", "event_ids", "tokens", "idle_ms"},
        "get_state": _INBOX_KEY,
        "count_duplicate": _INBOX_KEY,
        "record_rejection": _INBOX_KEY | {
            "reason", "content_digest", "event_type", "topic", "kafka_partition", "kafka_offset",
        },
        "renew_lease": _INBOX_KEY | {"lease_seconds", "token", "now"},
        "mark_succeeded": _INBOX_KEY | {"token", "idle_ms"},
        "record_failure": _INBOX_KEY | {"error", "token", "now"},
        "finish": _INBOX_KEY | {"state", "error", "token"},
        "abandon": _INBOX_KEY | {"error"},
        "abandon_gone": _INBOX_KEY | {"error", "topic", "kafka_partition", "kafka_offset"},
        "record_lease_lost": _INBOX_KEY | {"error"},
        "cancel": _INBOX_KEY | {"reason"},
        "cancel_unseen": _INBOX_KEY | {"reason"},
        "get_message": _INBOX_KEY,
        "list_messages": {"consumer", "state", "limit"},
        "list_rejections": {"consumer", "event_id", "limit"},
        "stats": set(),
        "delete_finished_batch": {"consumer", "window_seconds", "batch_size", "now"},
        "delete_rejections_batch": {"consumer", "window_seconds", "batch_size", "now"},
        "purge_consumers": {"window_seconds", "now"},
        "delete_dead": _INBOX_KEY,
    },
    "demo": {"progress": {"topic", "consumer", "group"}},
    "session": {
        "default_isolation": set(),
        "migration_timeouts_off": set(),
        "migration_timeouts_back": {"lock_timeout", "statement_timeout"},
    },
}  # fmt: skip

_PSYCOPG_PLACEHOLDER = re.compile(rb"%\((\w+)\)([sb])")


def all_queries(schema: str = "outboxkit") -> list[Query]:
    return [q for area in AREAS for q in queries(area, schema).values()]


@pytest.mark.parametrize("area", AREAS)
def test_every_statement_takes_the_parameters_its_callers_pass(area: str) -> None:
    loaded = queries(area, "custom_schema")
    assert set(loaded) == set(PARAMETERS[area])
    for name, q in loaded.items():
        assert q.parameters == PARAMETERS[area][name], name


@pytest.mark.parametrize("q", all_queries(), ids=lambda q: f"{q.area}.{q.name}")
def test_every_statement_compiles_to_psycopg_placeholders(q: Query) -> None:
    for form, style in ((q.psycopg, b"s"), (q.psycopg_binary, b"b")):
        found = _PSYCOPG_PLACEHOLDER.findall(form)
        assert {name.decode() for name, _ in found} == q.parameters
        assert {kind for _, kind in found} <= {style}
        # Every other '%' is escaped, and no ':name' is left behind.
        rest = _PSYCOPG_PLACEHOLDER.sub(b"", form).replace(b"%%", b"")
        assert b"%" not in rest
        assert re.search(rb"(?<![:\w\\]):\w", rest) is None
    assert "{" not in q.text.replace("'{}'", ""), "an unfilled {placeholder}"
    assert "\n--" not in q.text, "comment lines are dropped"


def test_one_schema_per_load() -> None:
    for q in all_queries("custom_schema"):
        assert '"outboxkit"' not in q.text
    # Every statement that names a table names it in the custom schema (LISTEN names a channel,
    # shards_lock_timeout only sets the lock timeout, pending_walk_only planner settings,
    # parked_lock takes an advisory lock,
    # notify_shards only notifies, probe asks whether the server answers, default_isolation
    # reads a setting, the migration_timeouts set the migrator's timeouts).
    no_table = {
        "listen",
        "shards_lock_timeout",
        "pending_walk_only",
        "parked_lock",
        "parked_try_lock",
        "notify_shards",
        "probe",
        "default_isolation",
        "migration_timeouts_off",
        "migration_timeouts_back",
    }
    tables = [q for q in all_queries("custom_schema") if q.name not in no_table]
    assert all('"custom_schema".' in q.text for q in tables)


def test_every_relay_write_is_fenced_by_the_lease_token() -> None:
    loaded = queries("relay", "outboxkit")
    for name in RELAY_WRITES:
        text = loaded[name].text
        assert '"outboxkit".relay_lease' in text, name
        assert "token = :token" in text, name
        assert "FOR SHARE" in text, name
        assert "EXISTS (SELECT 1 FROM lease)" in text, name


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("SELECT :x::int", "CAST"),
        ("SELECT %(x)s", "placeholder"),
    ],
)
def test_written_mistakes_are_refused(body: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _check("area", "name", body)


def test_a_name_is_never_cut_short() -> None:
    q = Query("a", "n", "SELECT :abc, 'x:y', '{}'::jsonb, a::text, :d")
    assert q.parameters == {"abc", "d"}
    assert q.psycopg == b"SELECT %(abc)s, 'x:y', '{}'::jsonb, a::text, %(d)s"


def test_the_writer_passes_exactly_the_insert_parameters() -> None:
    messages = [Message("t", b"1", key="k"), Message("t", b"2", idempotency_key="i")]
    notified = (None, [])
    names = set()
    for config in (OutboxConfig(), OutboxConfig(notify=False)):
        rows = [prepare(m, config) for m in messages]
        one = Plan(config, rows[:1]).insert_statement(notified)
        many = Plan(config, rows).insert_statement(notified)
        for name, params in (one, many):
            assert set(params) == PARAMETERS["outbox"][name]
            names.add(name)
    assert names == {"insert_one", "insert_many", "insert_one_silent", "insert_many_silent"}
    plan = Plan(config, rows)
    plan.insert_statement(notified)
    plan.take_inserted([])  # both keys taken: their rows are read back
    reread = plan.reread_statement()
    assert reread is not None
    assert set(reread[1]) == PARAMETERS["outbox"][reread[0]]
    assert set(outboxed_statement({})[1]) == PARAMETERS["outbox"]["select_outboxed"]
