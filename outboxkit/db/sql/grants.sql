-- Least-privilege grants, one block per role (docs/security.md explains each line).
-- {role} is the grantee, quoted as an identifier by outboxkit.db.grants (psycopg.sql), never
-- pasted as text. One statement per line; the owner/migrator runs them after `migrate up`.

-- name: app
-- The application (Outbox.add / add_many): insert rows, read back only what RETURNING and the
-- idempotency re-read need (no payloads, no UPDATE, no DELETE), compute the shard.
-- INSERT only of the columns the writer writes (outbox.sql: _columns and copy_rows, whose id
-- the sequence grant serves): state, attempts, xact_id, published_at, kafka_* and the parking
-- columns take their defaults, so no writer can store a parked row that holds back other
-- writers' rows of its key. The REVOKE first: earlier versions granted INSERT on the whole
-- table, and revoking it revokes the column grants too, so a re-run converges on this list.
GRANT USAGE ON SCHEMA {schema} TO {role};
REVOKE INSERT ON {schema}.outbox_message FROM {role};
GRANT INSERT (id, event_id, idempotency_key, content_digest, topic, message_key, payload, content_type, headers, event_type, schema_version, aggregate_type, aggregate_id, shard, deliver_after) ON {schema}.outbox_message TO {role};
GRANT SELECT (id, event_id, shard, xact_id, idempotency_key, content_digest) ON {schema}.outbox_message TO {role};
GRANT USAGE ON SEQUENCE {schema}.outbox_message_id_seq TO {role};
GRANT EXECUTE ON FUNCTION {schema}.outbox_shard(text, uuid, integer) TO {role};
GRANT SELECT ON {schema}.outbox_setting TO {role};

-- name: relay
-- The relay: claim, mark, park, delete (on_publish=delete, retention, housekeeping) outbox rows;
-- its leases and fencing tokens; read the pause switch, the shard count and the schema version.
GRANT USAGE ON SCHEMA {schema} TO {role};
GRANT SELECT, UPDATE, DELETE ON {schema}.outbox_message TO {role};
GRANT SELECT, INSERT, UPDATE ON {schema}.relay_lease TO {role};
GRANT SELECT, INSERT, UPDATE ON {schema}.relay_producer_slots TO {role};
GRANT SELECT ON {schema}.relay_control TO {role};
GRANT USAGE ON SEQUENCE {schema}.relay_fencing_token_seq TO {role};
GRANT SELECT ON {schema}.outbox_setting TO {role};
GRANT SELECT ON {schema}.schema_migration TO {role};

-- name: consumer
-- Inbox consumers: their dedup rows, rejections and lease tokens (their own effect tables are
-- the application's business). UPDATE (id) on the rejection log only so that the purge can lock
-- its batch (FOR UPDATE ... SKIP LOCKED needs UPDATE on one column): the identity column can
-- only be renumbered (GENERATED ALWAYS), and what a rejection says cannot be changed.
GRANT USAGE ON SCHEMA {schema} TO {role};
GRANT SELECT, INSERT, UPDATE, DELETE ON {schema}.inbox_message TO {role};
GRANT SELECT, INSERT, DELETE ON {schema}.inbox_rejection TO {role};
GRANT UPDATE (id) ON {schema}.inbox_rejection TO {role};
GRANT USAGE ON SEQUENCE {schema}.inbox_rejection_id_seq TO {role};
GRANT USAGE ON SEQUENCE {schema}.inbox_lease_token_seq TO {role};
GRANT SELECT ON {schema}.schema_migration TO {role};

-- name: app_may_set_state
-- After `migrate grants --apply`: can the application role still INSERT `state` (through
-- PUBLIC, a role it belongs to, another grantor's grant, or as the table's owner)? Then it could
-- still store a parked row; the REVOKE above removes only what was granted to it directly.
SELECT has_column_privilege(:role, '{schema}.outbox_message', 'state', 'INSERT');
