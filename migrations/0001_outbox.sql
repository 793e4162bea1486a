-- outboxkit 0001: the outbox table and its settings.
-- Runs with search_path set to the outboxkit schema (the runner does this; by hand:
--   SET search_path TO outboxkit;  before \i).

-- One row of settings the writers and relays share.
CREATE TABLE outbox_setting (
    singleton   boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    shard_count integer NOT NULL DEFAULT 1 CHECK (shard_count BETWEEN 1 AND 1024)
);
INSERT INTO outbox_setting DEFAULT VALUES;

-- The shard owning a key: a stable hash (first 32 bits of md5), so one shard owns a key forever
-- for a given shard_count. Keyless messages spread by event id.
CREATE FUNCTION outbox_shard(message_key text, event_id uuid, shard_count integer)
RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN ((('x' || substr(md5(coalesce(message_key, event_id::text)), 1, 8))::bit(32)::integer)
        & 2147483647) % shard_count;

CREATE TABLE outbox_message (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id        uuid NOT NULL,
    idempotency_key text NOT NULL,
    content_digest  bytea NOT NULL,
    topic           text NOT NULL,
    message_key     text,
    payload         bytea NOT NULL,
    content_type    text NOT NULL DEFAULT 'application/json',
    headers         jsonb NOT NULL DEFAULT '{}'::jsonb,
    event_type      text,
    schema_version  integer,
    aggregate_type  text,
    aggregate_id    text,
    shard           integer NOT NULL DEFAULT 0,
    xact_id         xid8 NOT NULL DEFAULT pg_current_xact_id(),
    created_at      timestamptz NOT NULL DEFAULT now(),
    deliver_after   timestamptz,
    state           text NOT NULL DEFAULT 'pending'
                    CHECK (state IN ('pending', 'published', 'parked', 'discarded')),
    attempts        integer NOT NULL DEFAULT 0,
    next_attempt_at timestamptz,
    last_error      text,
    parked_reason   text,
    parked_at       timestamptz,
    published_at    timestamptz,
    kafka_partition integer,
    kafka_offset    bigint,
    CONSTRAINT outbox_message_event_id_key UNIQUE (event_id),
    CONSTRAINT outbox_message_idempotency_key_key UNIQUE (idempotency_key)
);

-- The relay's claim query: pending rows of one shard in id order.
CREATE INDEX outbox_message_pending_idx ON outbox_message (shard, id) WHERE state = 'pending';
-- "Is an earlier row with this key parked?" (same-key rows wait behind a parked one).
CREATE INDEX outbox_message_parked_idx ON outbox_message (shard, message_key)
    WHERE state = 'parked';
-- Retention of published rows, oldest first.
CREATE INDEX outbox_message_published_idx ON outbox_message (published_at)
    WHERE state = 'published';
