-- outboxkit 0003: the consumer dedup table (inbox) and its rejection log.

-- Lease tokens for inbox rows come from one logged sequence, so a newer claim always holds a
-- larger token than any older (possibly zombie) handler of the same event.
CREATE SEQUENCE inbox_lease_token_seq AS bigint;

-- One row per (consumer, event id): how that event ended for that consumer.
-- Terminal states (succeeded, dead, rejected, cancelled) are never overwritten: every state
-- change is conditional on state = 'processing' (and on the lease token for handler outcomes).
CREATE TABLE inbox_message (
    consumer         text NOT NULL,
    event_id         text NOT NULL,
    idempotency_key  text,
    content_digest   bytea,            -- NULL only for rows created by a cancel before delivery
    event_type       text,
    state            text NOT NULL DEFAULT 'processing'
                     CHECK (state IN ('processing', 'succeeded', 'dead', 'rejected', 'cancelled')),
    attempts         integer NOT NULL DEFAULT 0,
    last_error       text,
    lease_owner      text,
    lease_token      bigint,
    lease_expires_at timestamptz,
    lease_lost_count integer NOT NULL DEFAULT 0,
    topic            text,
    kafka_partition  integer,
    kafka_offset     bigint,
    duplicate_count  integer NOT NULL DEFAULT 0,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    finished_at      timestamptz,
    PRIMARY KEY (consumer, event_id),
    CHECK ((state = 'processing') = (finished_at IS NULL))
);

-- Retention removes terminal rows oldest first, in small batches.
CREATE INDEX inbox_message_finished_idx ON inbox_message (finished_at)
    WHERE state <> 'processing';

-- Deliveries that could not be recorded against their own (consumer, event id) row: a message
-- without an event id, or an event id reused with different content (the original row stays
-- untouched), or a replay older than the dedup window. Readable back like inbox rows.
CREATE TABLE inbox_rejection (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    consumer        text NOT NULL,
    event_id        text,
    reason          text NOT NULL,
    content_digest  bytea,
    event_type      text,
    topic           text NOT NULL,
    kafka_partition integer NOT NULL,
    kafka_offset    bigint NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    UNIQUE (consumer, topic, kafka_partition, kafka_offset)
);

CREATE INDEX inbox_rejection_event_idx ON inbox_rejection (consumer, event_id);
CREATE INDEX inbox_rejection_created_idx ON inbox_rejection (created_at);
