-- Consumer dedup middleware (outboxkit.inbox). Every state change is conditional on
-- state = 'processing' so a terminal state is never overwritten; handler outcomes are also
-- conditional on the lease token of the claim that ran the handler.

-- Lease expiry and the purge window are judged against :now when given (tests pass a later time
-- instead of sleeping), else the database clock.

-- name: _takeover
-- A claim of an unfinished row (same content): attempts + 1 and the newer token.
ON CONFLICT (consumer, event_id) DO UPDATE
SET attempts = m.attempts + 1,
    lease_owner = EXCLUDED.lease_owner,
    lease_token = EXCLUDED.lease_token,
    lease_expires_at = EXCLUDED.lease_expires_at,
    topic = EXCLUDED.topic,
    kafka_partition = EXCLUDED.kafka_partition,
    kafka_offset = EXCLUDED.kafka_offset,
    updated_at = now()
WHERE m.state = 'processing' AND m.content_digest = EXCLUDED.content_digest

-- name: claim
-- A new event gets a processing row; a redelivery of an unfinished one (same content) takes the
-- lease over with a newer token, which fences any older handler still running for it.
-- The claim alone need not wait for its WAL flush (synchronous_commit off, for this statement's
-- own transaction only): if a crash loses it, the redelivery simply claims again, and every
-- later synchronous commit (the handler's, a cancel) flushes the WAL past it.
WITH relaxed AS (SELECT set_config('synchronous_commit', 'off', true) AS setting)
INSERT INTO {schema}.inbox_message AS m
    (consumer, event_id, idempotency_key, content_digest, event_type, state, attempts,
     lease_owner, lease_token, lease_expires_at, topic, kafka_partition, kafka_offset)
SELECT
    :consumer, :event_id, :idempotency_key, :content_digest, :event_type, 'processing', 1,
    :owner, nextval('{schema}.inbox_lease_token_seq'),
    coalesce(CAST(:now AS timestamptz), now()) + make_interval(secs => :lease_seconds),
    :topic, :kafka_partition, :kafka_offset
FROM relaxed
{_takeover}
RETURNING m.lease_token, m.attempts, m.last_error;

-- name: claim_batch
-- The claim of several deliveries in one statement (batched processing): the same rules as
-- `claim`, row by row. Rows it does not return are duplicates or reused ids (asked one by one).
WITH relaxed AS (SELECT set_config('synchronous_commit', 'off', true) AS setting),
given AS (
    SELECT * FROM unnest(
        CAST(:event_ids AS text[]), CAST(:idempotency_keys AS text[]),
        CAST(:content_digests AS bytea[]), CAST(:event_types AS text[]),
        CAST(:topics AS text[]), CAST(:kafka_partitions AS integer[]),
        CAST(:kafka_offsets AS bigint[])
    ) WITH ORDINALITY AS g(event_id, idempotency_key, content_digest, event_type, topic,
                           kafka_partition, kafka_offset, position)
)
INSERT INTO {schema}.inbox_message AS m
    (consumer, event_id, idempotency_key, content_digest, event_type, state, attempts,
     lease_owner, lease_token, lease_expires_at, topic, kafka_partition, kafka_offset)
SELECT
    :consumer, g.event_id, g.idempotency_key, g.content_digest, g.event_type, 'processing', 1,
    :owner, nextval('{schema}.inbox_lease_token_seq'),
    coalesce(CAST(:now AS timestamptz), now()) + make_interval(secs => :lease_seconds),
    g.topic, g.kafka_partition, g.kafka_offset
FROM given AS g CROSS JOIN relaxed
ORDER BY g.position
{_takeover}
RETURNING m.event_id, m.lease_token, m.attempts, m.last_error;

-- name: _batch_keys
-- The batch statements' rows: each event with its token and the consumer, one row per event, so
-- the planner looks each up by the whole primary key (consumer, event_id). The consumer is not a
-- constant (`m.consumer = :consumer`) nor a one-row subquery joined first: with statistics that
-- do not know a new consumer's rows yet (before ANALYZE), or none at all (a table never
-- analyzed), the planner then read all of that consumer's rows (a scan growing with the table)
-- to find the batch's.
unnest(
    CAST(:event_ids AS text[]), CAST(:tokens AS bigint[]),
    array_fill(CAST(:consumer AS text), ARRAY[cardinality(CAST(:event_ids AS text[]))])
) AS g(event_id, token, consumer)

-- name: release_batch
-- Claimed in a batch but not run (behind a failed record of the same partition, or after the
-- batch was cut), or a run the database interrupted (in a batch or alone): the claim is given
-- back, so it does not count as an attempt. The row takes a token nobody holds: a give-back
-- whose reply was lost, made again (owed), then matches nothing instead of taking a second
-- attempt back.
UPDATE {schema}.inbox_message AS m
SET attempts = m.attempts - 1, updated_at = now(),
    lease_token = nextval('{schema}.inbox_lease_token_seq'),
    lease_expires_at = coalesce(CAST(:now AS timestamptz), now())
FROM {_batch_keys}
WHERE m.consumer = g.consumer AND m.event_id = g.event_id AND m.state = 'processing'
  AND m.lease_token = g.token;

-- name: release_stopped_batch
-- `release_batch` at a stop (KeyboardInterrupt, SystemExit, the task's cancellation) that ended
-- a batch: a row another transaction holds is skipped, not waited for (nothing would end that
-- wait: a stop is not repeated), and stays counted.
WITH free AS (
    SELECT m.consumer, m.event_id
    FROM {_batch_keys} JOIN {schema}.inbox_message AS m
        ON m.consumer = g.consumer AND m.event_id = g.event_id
    WHERE m.state = 'processing' AND m.lease_token = g.token
    FOR UPDATE OF m SKIP LOCKED
)
UPDATE {schema}.inbox_message AS m
SET attempts = m.attempts - 1, updated_at = now(),
    lease_token = nextval('{schema}.inbox_lease_token_seq'),
    lease_expires_at = coalesce(CAST(:now AS timestamptz), now())
FROM free
WHERE m.consumer = free.consumer AND m.event_id = free.event_id;

-- name: get_state
-- The attempts and last error too: a delivery that finds its event finished acknowledges the
-- outcome as recorded (the delivery that finished it may have died before acknowledging it).
SELECT state, content_digest, attempts, last_error FROM {schema}.inbox_message
WHERE consumer = :consumer AND event_id = :event_id;

-- name: count_duplicate
UPDATE {schema}.inbox_message SET duplicate_count = duplicate_count + 1
WHERE consumer = :consumer AND event_id = :event_id;

-- name: record_rejection
INSERT INTO {schema}.inbox_rejection
    (consumer, event_id, reason, content_digest, event_type, topic, kafka_partition, kafka_offset)
VALUES
    (:consumer, :event_id, :reason, :content_digest, :event_type, :topic, :kafka_partition,
     :kafka_offset)
ON CONFLICT (consumer, topic, kafka_partition, kafka_offset) DO NOTHING;

-- name: renew_lease
UPDATE {schema}.inbox_message
SET lease_expires_at = coalesce(CAST(:now AS timestamptz), now())
        + make_interval(secs => :lease_seconds),
    updated_at = now()
WHERE consumer = :consumer AND event_id = :event_id AND state = 'processing'
  AND lease_token = :token;

-- name: _quiet_bound
-- After the mark only the COMMIT is left. A session that goes quiet there (its process frozen,
-- a network partition that sends no reset) would keep the marked rows locked, and the new
-- owner's claim of them waits for as long: hours, until TCP keepalive ends the session. For the
-- rest of this transaction the server ends a session idle in it for :idle_ms instead, or for
-- the session's own idle_in_transaction_session_timeout when that is shorter (not 0).
bounded AS (
    SELECT set_config(
        'idle_in_transaction_session_timeout',
        CAST(CASE WHEN s.ms > 0 AND s.ms < CAST(:idle_ms AS bigint) THEN s.ms
                  ELSE CAST(:idle_ms AS bigint) END AS text),
        true)
    FROM (SELECT CAST(extract(epoch FROM CAST(
              current_setting('idle_in_transaction_session_timeout') AS interval)) * 1000
              AS bigint) AS ms) AS s
)

-- name: mark_succeeded
WITH {_quiet_bound}
UPDATE {schema}.inbox_message
SET state = 'succeeded', finished_at = now(), updated_at = now(), lease_expires_at = NULL
FROM bounded
WHERE consumer = :consumer AND event_id = :event_id AND state = 'processing'
  AND lease_token = :token;

-- name: mark_succeeded_batch
-- The successes of a batch, in its one transaction: each conditional on its own token.
WITH {_quiet_bound}
UPDATE {schema}.inbox_message AS m
SET state = 'succeeded', finished_at = now(), updated_at = now(), lease_expires_at = NULL
FROM {_batch_keys} CROSS JOIN bounded
WHERE m.consumer = g.consumer AND m.event_id = g.event_id AND m.state = 'processing'
  AND m.lease_token = g.token
RETURNING m.event_id;

-- name: record_failure
UPDATE {schema}.inbox_message
SET last_error = :error, updated_at = now(),
    lease_expires_at = coalesce(CAST(:now AS timestamptz), now())
WHERE consumer = :consumer AND event_id = :event_id AND state = 'processing'
  AND lease_token = :token;

-- name: finish
-- dead or rejected, by the handler run that holds the token.
UPDATE {schema}.inbox_message
SET state = :state, last_error = :error, finished_at = now(), updated_at = now(),
    lease_expires_at = NULL
WHERE consumer = :consumer AND event_id = :event_id AND state = 'processing'
  AND lease_token = :token;

-- name: abandon
-- Given up after repeated unexpected errors (whoever holds the lease): dead, with the reason.
-- The row's attempts come back for the acknowledgement (the caller has no claim to count them).
UPDATE {schema}.inbox_message
SET state = 'dead', last_error = :error, finished_at = now(), updated_at = now(),
    lease_expires_at = NULL
WHERE consumer = :consumer AND event_id = :event_id AND state = 'processing'
RETURNING attempts;

-- name: abandon_gone
-- The record held for a retry left the log (retention, compaction, delete_records): nothing will
-- deliver it again, so its row ends dead, with the reason. Only while the row still names that
-- record: a copy of the event at another offset that took the row over runs on. The row's
-- attempts come back for the acknowledgement (no row: it was not ended here, nothing to ack).
UPDATE {schema}.inbox_message
SET state = 'dead', last_error = :error, finished_at = now(), updated_at = now(),
    lease_expires_at = NULL
WHERE consumer = :consumer AND event_id = :event_id AND state = 'processing'
  AND topic = :topic AND kafka_partition = :kafka_partition AND kafka_offset = :kafka_offset
RETURNING attempts;

-- name: record_lease_lost
UPDATE {schema}.inbox_message
SET lease_lost_count = lease_lost_count + 1,
    last_error = CASE WHEN state = 'processing' THEN :error ELSE last_error END,
    updated_at = now()
WHERE consumer = :consumer AND event_id = :event_id;

-- name: cancel
UPDATE {schema}.inbox_message
SET state = 'cancelled', last_error = :reason, finished_at = now(), updated_at = now(),
    lease_expires_at = NULL
WHERE consumer = :consumer AND event_id = :event_id AND state = 'processing';

-- name: cancel_unseen
-- Cancel an event before it is delivered: its delivery will then be skipped.
INSERT INTO {schema}.inbox_message (consumer, event_id, state, last_error, finished_at)
VALUES (:consumer, :event_id, 'cancelled', :reason, now())
ON CONFLICT (consumer, event_id) DO NOTHING;

-- name: get_message
SELECT consumer, event_id, idempotency_key, event_type, state, attempts, last_error,
       lease_owner, lease_token, lease_expires_at, lease_lost_count, topic, kafka_partition,
       kafka_offset, duplicate_count, created_at, updated_at, finished_at
FROM {schema}.inbox_message
WHERE consumer = :consumer AND event_id = :event_id;

-- name: list_messages
SELECT consumer, event_id, idempotency_key, event_type, state, attempts, last_error,
       lease_owner, lease_token, lease_expires_at, lease_lost_count, topic, kafka_partition,
       kafka_offset, duplicate_count, created_at, updated_at, finished_at
FROM {schema}.inbox_message
WHERE (CAST(:consumer AS text) IS NULL OR consumer = :consumer)
  AND (CAST(:state AS text) IS NULL OR state = :state)
ORDER BY updated_at DESC
LIMIT :limit;

-- name: list_rejections
SELECT id, consumer, event_id, reason, event_type, topic, kafka_partition, kafka_offset,
       created_at
FROM {schema}.inbox_rejection
WHERE (CAST(:consumer AS text) IS NULL OR consumer = :consumer)
  AND (CAST(:event_id AS text) IS NULL OR event_id = :event_id)
ORDER BY id DESC
LIMIT :limit;

-- name: stats
SELECT consumer, state, count(*) AS events, coalesce(sum(duplicate_count), 0) AS duplicates
FROM {schema}.inbox_message
GROUP BY consumer, state
UNION ALL
SELECT consumer, 'rejection_log', count(*), 0
FROM {schema}.inbox_rejection
GROUP BY consumer
ORDER BY 1, 2;

-- name: _purge_cutoff
coalesce(CAST(:now AS timestamptz), now()) - make_interval(secs => :window_seconds)

-- name: delete_finished_batch
-- One consumer's rows: each consumer keeps its dedup rows for its own window, so one consumer's
-- purge must never forget the events another one still has to recognise. Every step seeks, in a
-- generic plan too: consumer = :consumer (an "or every consumer" test cannot seek), a range of
-- inbox_message_consumer_finished_idx (no row of another consumer is read), then the batch's
-- keys as one array (a join with the batch was hashed against the whole table: a generic plan
-- cannot tell how few rows the LIMIT keeps).
DELETE FROM {schema}.inbox_message
WHERE consumer = :consumer
  AND event_id = ANY (ARRAY(
    SELECT event_id FROM {schema}.inbox_message
    WHERE consumer = :consumer AND state <> 'processing' AND finished_at < {_purge_cutoff}
    ORDER BY finished_at
    LIMIT :batch_size
    FOR UPDATE SKIP LOCKED
  ));

-- name: delete_rejections_batch
-- One consumer's rejections, as delete_finished_batch (inbox_rejection_consumer_created_idx).
-- FOR UPDATE needs the UPDATE privilege on one column: grants.sql gives the consumer role
-- UPDATE (id), which can only renumber a row (GENERATED ALWAYS), never change what it says.
DELETE FROM {schema}.inbox_rejection
WHERE id = ANY (ARRAY(
    SELECT id FROM {schema}.inbox_rejection
    WHERE consumer = :consumer AND created_at < {_purge_cutoff}
    ORDER BY created_at
    LIMIT :batch_size
    FOR UPDATE SKIP LOCKED
));

-- name: purge_consumers
-- The consumers with rows (or rejections) past the window, for a purge of every consumer's
-- (`inbox purge --all-consumers`), which then runs the one-consumer purges for each: no index
-- orders the whole table by finish time, and every row past the window goes either way. Each
-- table's consumers are found by a skip scan of an index that leads with them (one seek per
-- consumer, not a read of every row), and one is kept if its oldest row (one more seek) is past
-- the window.
WITH RECURSIVE messages AS (
    (SELECT consumer FROM {schema}.inbox_message ORDER BY consumer LIMIT 1)
    UNION ALL
    SELECT (
        SELECT n.consumer FROM {schema}.inbox_message AS n
        WHERE n.consumer > c.consumer ORDER BY n.consumer LIMIT 1
    )
    FROM messages AS c
    WHERE c.consumer IS NOT NULL
), rejections AS (
    (SELECT consumer FROM {schema}.inbox_rejection ORDER BY consumer LIMIT 1)
    UNION ALL
    SELECT (
        SELECT n.consumer FROM {schema}.inbox_rejection AS n
        WHERE n.consumer > c.consumer ORDER BY n.consumer LIMIT 1
    )
    FROM rejections AS c
    WHERE c.consumer IS NOT NULL
)
SELECT c.consumer FROM messages AS c
WHERE (
    SELECT min(m.finished_at) FROM {schema}.inbox_message AS m
    WHERE m.consumer = c.consumer AND m.state <> 'processing'
) < {_purge_cutoff}
UNION
SELECT c.consumer FROM rejections AS c
WHERE (
    SELECT min(r.created_at) FROM {schema}.inbox_rejection AS r WHERE r.consumer = c.consumer
) < {_purge_cutoff}
ORDER BY 1;

-- name: delete_dead
-- `inbox replay`: forget a dead event so its re-published record is handled again. Only a row
-- still dead goes: one that changed meanwhile (replayed and running, say) stays.
DELETE FROM {schema}.inbox_message
WHERE consumer = :consumer AND event_id = :event_id AND state = 'dead';
