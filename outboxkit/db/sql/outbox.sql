-- Application-side writes to the outbox (outboxkit.outbox) and the read-backs of
-- outboxkit.testing. Parameters use SQLAlchemy's :name style.
--
-- The shard is computed here, by the same SQL function the relay uses, so they always agree.
-- NOTIFY: once per (transaction, shard) as a rule; the caller passes the transaction id and the
-- shards it already notified in it whose notifications still stand, so later writes in the same
-- transaction send nothing (after a savepoint was rolled back or released, they may send again).

-- name: _columns
event_id, idempotency_key, content_digest, topic, message_key, payload, content_type,
    headers, event_type, schema_version, aggregate_type, aggregate_id, shard, deliver_after

-- name: _one_row
VALUES (
    CAST(:event_id AS uuid), :idempotency_key, :content_digest, :topic, :message_key,
    :payload, :content_type, CAST(:headers AS jsonb), :event_type, :schema_version,
    :aggregate_type, :aggregate_id,
    {schema}.outbox_shard(CAST(:message_key AS text), CAST(:event_id AS uuid),
                          (SELECT shard_count FROM {schema}.outbox_setting)),
    :deliver_after
)

-- name: _many_rows
SELECT i.event_id, i.idempotency_key, i.content_digest, i.topic, i.message_key, i.payload,
       i.content_type, i.headers, i.event_type, i.schema_version, i.aggregate_type,
       i.aggregate_id,
       {schema}.outbox_shard(i.message_key, i.event_id,
                             (SELECT shard_count FROM {schema}.outbox_setting)),
       i.deliver_after
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
ORDER BY i.ord

-- name: _notify
RETURNING id, event_id, shard, CAST(xact_id AS text) AS xact_id,
    (CASE WHEN CAST(:channel AS text) IS NOT NULL
           AND (CAST(xact_id AS text) IS DISTINCT FROM CAST(:notified_xact AS text)
                OR shard <> ALL (CAST(:notified_shards AS integer[])))
          THEN pg_notify(:channel, CAST(shard AS text)) END) IS NOT NULL AS notified

-- name: insert_one
-- One message. Returns its row if inserted; nothing if the idempotency key is taken (after
-- waiting for a concurrent holder of the key to commit or roll back): the caller then re-reads.
INSERT INTO {schema}.outbox_message ({_columns})
{_one_row}
ON CONFLICT (idempotency_key) DO NOTHING
{_notify};

-- name: insert_one_silent
-- insert_one without NOTIFY: fewer parameters and a shorter RETURNING (relays poll).
INSERT INTO {schema}.outbox_message ({_columns})
{_one_row}
ON CONFLICT (idempotency_key) DO NOTHING
RETURNING id, event_id;

-- name: insert_many
-- Many messages in one round trip (ids follow the input order). Same meaning as insert_one,
-- per row. Idempotency keys must be unique within the call (the caller folds repeats).
-- PostgreSQL folds identical notifications of one transaction, so one per shard is delivered.
INSERT INTO {schema}.outbox_message ({_columns})
{_many_rows}
ON CONFLICT (idempotency_key) DO NOTHING
{_notify};

-- name: insert_many_silent
-- insert_many without NOTIFY.
INSERT INTO {schema}.outbox_message ({_columns})
{_many_rows}
ON CONFLICT (idempotency_key) DO NOTHING
RETURNING id, event_id;

-- name: select_by_idempotency_keys
-- The rows holding keys our insert skipped. A new statement, so in READ COMMITTED it also sees
-- a row that a concurrent transaction committed while our insert waited for it.
SELECT idempotency_key, event_id, content_digest
FROM {schema}.outbox_message
WHERE idempotency_key = ANY (CAST(:idempotency_keys AS text[]));

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

-- name: state_counts
-- How many rows are in each state (the demo waits for pending to reach zero).
SELECT state, count(*) FROM {schema}.outbox_message GROUP BY state;

-- name: copy_lock
-- Before add_many's COPY path reads the shard count: the lock an INSERT takes by itself, so
-- `relay shards` (SHARE) cannot change the count between that read and the COPY, and a switch
-- in progress is waited for, its new count then read (READ COMMITTED: the next statement's
-- snapshot is taken after the wait). Taken by an INSERT of no row, which needs only INSERT of
-- one written column: LOCK TABLE would need INSERT on the whole table, which the application
-- role does not have (grants.sql).
INSERT INTO {schema}.outbox_message (event_id) SELECT CAST(NULL AS uuid) WHERE false;

-- name: copy_setting
-- What add_many's COPY path needs to compute shards exactly as outbox_shard does: the shard
-- count, and the encoding md5 sees text in (the Python twin assumes UTF8, else no COPY). Then
-- the ids: when the role may write the id column (and take values of its sequence), :rows ids
-- from the identity in increasing order, which the COPY writes in input order, so nothing is
-- read back; ids not used (folded repeats, a failed COPY) are gaps, as after any rollback.
-- Otherwise (a role that cannot choose ids) the highest id this transaction sees, below every
-- id the COPY will take (see copied_ids). Only the branch taken runs its subquery, and no id is
-- taken on a database the COPY path does not serve (not UTF8).
SELECT shard_count, current_setting('server_encoding'),
       CASE WHEN privileged THEN
           (SELECT array_agg(n.id ORDER BY n.id)
            FROM (SELECT nextval('{schema}.outbox_message_id_seq') AS id
                  FROM generate_series(1, CAST(:rows AS integer))) AS n)
       END,
       CASE WHEN NOT privileged THEN
           (SELECT coalesce(max(id), 0) FROM {schema}.outbox_message)
       END
FROM {schema}.outbox_setting,
     LATERAL (SELECT has_sequence_privilege('{schema}.outbox_message_id_seq', 'USAGE')
                     AND has_column_privilege('{schema}.outbox_message', 'id', 'INSERT')
                     AND current_setting('server_encoding') = 'UTF8'
                     AS privileged) AS p;

-- name: copy_rows
-- add_many of many rows: a COPY straight into the table (no ON CONFLICT: a taken key or event
-- id fails it, the caller rolls back to its savepoint and inserts with ON CONFLICT instead).
-- The ids come from copy_setting (COPY may write an identity column GENERATED ALWAYS).
COPY {schema}.outbox_message (
    event_id, idempotency_key, content_digest, topic, message_key, payload, content_type,
    headers, event_type, schema_version, aggregate_type, aggregate_id, deliver_after, shard, id
) FROM STDIN;

-- name: copy_rows_default_ids
-- copy_rows for a role that may not write ids: the identity numbers the rows, copied_ids reads
-- them back.
COPY {schema}.outbox_message (
    event_id, idempotency_key, content_digest, topic, message_key, payload, content_type,
    headers, event_type, schema_version, aggregate_type, aggregate_id, deliver_after, shard
) FROM STDIN;

-- name: copied_ids
-- The ids of the rows just copied by copy_rows_default_ids, in input order: the identity hands
-- this session increasing values, all above :after_id (read before the COPY), and rows of
-- other transactions in that range have another xact_id. One short primary-key range scan. The
-- caller checks the count: a sequence cache above 1 could have handed us lower ids, and then it
-- asks copied_ids_by_event_id instead.
SELECT id FROM {schema}.outbox_message
WHERE id > :after_id AND xact_id = pg_current_xact_id()
ORDER BY id;

-- name: copied_ids_by_event_id
-- copied_ids, one event_id index probe per row (a correlated lookup, so no plan can turn it
-- into a scan of the table).
SELECT (SELECT m.id FROM {schema}.outbox_message m WHERE m.event_id = e.event_id)
FROM unnest(CAST(:event_ids AS uuid[])) WITH ORDINALITY AS e (event_id, ord)
ORDER BY e.ord;

-- name: notify_shards
-- After a COPY: notify each shard not yet notified in this transaction (as insert_many does).
SELECT s.shard, CAST(pg_current_xact_id() AS text) AS xact_id,
    (CASE WHEN CAST(pg_current_xact_id() AS text) IS DISTINCT FROM CAST(:notified_xact AS text)
               OR s.shard <> ALL (CAST(:notified_shards AS integer[]))
          THEN pg_notify(:channel, CAST(s.shard AS text)) END) IS NOT NULL AS notified
FROM unnest(CAST(:shards AS integer[])) AS s (shard);
