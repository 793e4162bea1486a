-- Application-side writes to the outbox (outboxkit.outbox) and the read-backs of
-- outboxkit.testing. Parameters use SQLAlchemy's :name style.
--
-- The shard is computed here, by the same SQL function the relay uses, so they always agree.
-- NOTIFY: at most once per (transaction, shard); the caller passes the transaction id and the
-- shards it already notified in it, so later writes in the same transaction send nothing.

-- name: insert_one
-- One message. Inserted: its id/event_id. Idempotency key already taken by a row visible to
-- this statement: that row's event_id and digest (id NULL). Taken by a transaction that
-- committed after this statement's snapshot: no row at all (the caller re-reads).
WITH ins AS (
    INSERT INTO {schema}.outbox_message (
        event_id, idempotency_key, content_digest, topic, message_key, payload, content_type,
        headers, event_type, schema_version, aggregate_type, aggregate_id, shard, deliver_after
    )
    SELECT CAST(:event_id AS uuid), :idempotency_key, :content_digest, :topic, :message_key,
           :payload, :content_type, CAST(:headers AS jsonb), :event_type, :schema_version,
           :aggregate_type, :aggregate_id,
           {schema}.outbox_shard(CAST(:message_key AS text), CAST(:event_id AS uuid),
                                 s.shard_count),
           :deliver_after
    FROM {schema}.outbox_setting AS s
    ON CONFLICT (idempotency_key) DO NOTHING
    RETURNING id, event_id, shard, xact_id
)
SELECT ins.id, ins.event_id, CAST(NULL AS bytea) AS content_digest, ins.shard,
       CAST(ins.xact_id AS text) AS xact_id,
       (CASE WHEN CAST(:channel AS text) IS NOT NULL
              AND (CAST(ins.xact_id AS text) IS DISTINCT FROM CAST(:notified_xact AS text)
                   OR ins.shard <> ALL (CAST(:notified_shards AS integer[])))
             THEN pg_notify(:channel, CAST(ins.shard AS text)) END) IS NOT NULL AS notified
FROM ins
UNION ALL
SELECT NULL, m.event_id, m.content_digest, m.shard, NULL, false
FROM {schema}.outbox_message AS m
WHERE m.idempotency_key = :idempotency_key AND NOT EXISTS (SELECT FROM ins);

-- name: insert_many
-- Many messages in one round trip, one result row per input row (by ordinal), same meaning as
-- insert_one. Idempotency keys must be unique within the call (the caller folds repeats).
WITH input AS (
    SELECT *
    FROM unnest(
        CAST(:event_ids AS uuid[]), CAST(:idempotency_keys AS text[]),
        CAST(:content_digests AS bytea[]), CAST(:topics AS text[]),
        CAST(:message_keys AS text[]), CAST(:payloads AS bytea[]),
        CAST(:content_types AS text[]), CAST(:headers AS jsonb[]),
        CAST(:event_types AS text[]), CAST(:schema_versions AS integer[]),
        CAST(:aggregate_types AS text[]), CAST(:aggregate_ids AS text[]),
        CAST(:deliver_afters AS timestamptz[])
    ) WITH ORDINALITY AS i (
        event_id, idempotency_key, content_digest, topic, message_key, payload, content_type,
        headers, event_type, schema_version, aggregate_type, aggregate_id, deliver_after, ord
    )
), ins AS (
    INSERT INTO {schema}.outbox_message (
        event_id, idempotency_key, content_digest, topic, message_key, payload, content_type,
        headers, event_type, schema_version, aggregate_type, aggregate_id, shard, deliver_after
    )
    SELECT i.event_id, i.idempotency_key, i.content_digest, i.topic, i.message_key, i.payload,
           i.content_type, i.headers, i.event_type, i.schema_version, i.aggregate_type,
           i.aggregate_id, {schema}.outbox_shard(i.message_key, i.event_id, s.shard_count),
           i.deliver_after
    FROM input AS i CROSS JOIN {schema}.outbox_setting AS s
    ORDER BY i.ord
    ON CONFLICT (idempotency_key) DO NOTHING
    RETURNING id, event_id, shard, xact_id
)
SELECT i.ord, ins.id, coalesce(ins.event_id, m.event_id) AS event_id, m.content_digest,
       ins.shard, CAST(ins.xact_id AS text) AS xact_id,
       (CASE WHEN ins.id IS NOT NULL
              AND CAST(:channel AS text) IS NOT NULL
              AND row_number() OVER (PARTITION BY ins.shard ORDER BY i.ord) = 1
              AND (CAST(ins.xact_id AS text) IS DISTINCT FROM CAST(:notified_xact AS text)
                   OR ins.shard <> ALL (CAST(:notified_shards AS integer[])))
             THEN pg_notify(:channel, CAST(ins.shard AS text)) END) IS NOT NULL AS notified
FROM input AS i
LEFT JOIN ins ON ins.event_id = i.event_id
LEFT JOIN {schema}.outbox_message AS m
       ON ins.id IS NULL AND m.idempotency_key = i.idempotency_key
ORDER BY i.ord;

-- name: select_by_idempotency_keys
-- Re-read (new snapshot) the rows that a concurrent transaction committed while we waited.
SELECT idempotency_key, event_id, content_digest
FROM {schema}.outbox_message
WHERE idempotency_key = ANY (CAST(:idempotency_keys AS text[]));

-- name: delete_written
-- Undo this call's own rows when a later row of the same add_many conflicts.
DELETE FROM {schema}.outbox_message WHERE id = ANY (CAST(:ids AS bigint[]));

-- name: select_outboxed
-- outboxkit.testing: the rows visible to the caller's transaction, optionally filtered.
SELECT id, event_id, idempotency_key, topic, message_key, payload, content_type, headers,
       event_type, schema_version, aggregate_type, aggregate_id, shard, state, created_at
FROM {schema}.outbox_message
WHERE (CAST(:event_type AS text) IS NULL OR event_type = :event_type)
  AND (CAST(:message_key AS text) IS NULL OR message_key = :message_key)
  AND (CAST(:topic AS text) IS NULL OR topic = :topic)
  AND (CAST(:aggregate_id AS text) IS NULL OR aggregate_id = :aggregate_id)
ORDER BY id;
