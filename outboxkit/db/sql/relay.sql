-- The relay's queries. Every write is conditional on the caller's lease token; the lease row is
-- read FOR SHARE so a write and a takeover's UPDATE of that row serialise.

-- name: shard_count
SELECT shard_count FROM {schema}.outbox_setting;

-- name: outbox_identity
-- Which outbox this is, for the checkpoints its relay writes (migration 0006).
SELECT CAST(outbox_id AS text) FROM {schema}.outbox_setting;

-- name: probe
-- A stopping process (the relay, `inbox run`) asks whether the server answers at all: a
-- statement, not only a login, which a pooler such as PgBouncer answers by itself.
SELECT 1;

-- name: lease_acquire
-- Take the lease when it is free, expired (by the database clock) or already ours (a restart of
-- our own session). A fresh token every time; nextval only grows. The "now" parameter is NULL in
-- production (the database clock); tests pass a later time instead of waiting for an expiry.
-- A lease another holder keeps is seen without a lock and left alone: ON CONFLICT DO UPDATE
-- locks the row before testing its WHERE, so every standby's attempt would otherwise queue for
-- the row against the holder's fenced writes (FOR SHARE), and make them wait, or fail under a
-- lock_timeout. The WHERE below still decides under the lock, and a takeover draws its token
-- there too: one drawn before the lock could be smaller than the token of a holder that took
-- the lease and gave it up while this statement waited.
-- previous: the token of the term before this one (NULL: the first), as the statement found
-- the row. A holder that took the lease in between holds it still at the lock (this statement
-- waits for its acquisition to commit, then finds it held), so the acquisition fails: a term
-- that got the lease knows whether its shard had another holder since a term of its own
-- (at_least_once marks owed across terms, owed_marks.py).
WITH before AS (
    SELECT token FROM {schema}.relay_lease WHERE relay_group = :group AND shard = :shard
)
INSERT INTO {schema}.relay_lease AS l (relay_group, shard, holder, token, expires_at)
SELECT :group, :shard, :holder, nextval('{schema}.relay_fencing_token_seq'),
       coalesce(CAST(:now AS timestamptz), now()) + :ttl * interval '1 second'
WHERE NOT EXISTS (
    SELECT 1 FROM {schema}.relay_lease
    WHERE relay_group = :group AND shard = :shard AND holder IS NOT NULL AND holder <> :holder
      AND expires_at > coalesce(CAST(:now AS timestamptz), now())
)
ON CONFLICT (relay_group, shard) DO UPDATE
SET holder = excluded.holder, token = nextval('{schema}.relay_fencing_token_seq'),
    acquired_at = now(), renewed_at = now(), expires_at = excluded.expires_at
WHERE l.holder IS NULL OR l.holder = excluded.holder
   OR l.expires_at <= coalesce(CAST(:now AS timestamptz), now())
RETURNING token, (SELECT token FROM before) AS previous;

-- name: lease_renew_many
-- Every lease one relay process holds, renewed in one statement on one connection (a process
-- holding many shards must not need a connection per shard for this). Returns the shards renewed;
-- a term whose shard is missing was lost (expired or taken over) and is never revived.
UPDATE {schema}.relay_lease AS l
SET renewed_at = now(),
    expires_at = coalesce(CAST(:now AS timestamptz), now()) + :ttl * interval '1 second'
FROM unnest(CAST(:shards AS integer[]), CAST(:tokens AS bigint[])) AS t(shard, token)
WHERE l.relay_group = :group AND l.shard = t.shard AND l.token = t.token
  AND l.holder = :holder AND l.expires_at > coalesce(CAST(:now AS timestamptz), now())
RETURNING l.shard;

-- name: lease_state
-- Why a token check or a renewal just failed, for the log and the lease-lost reason: the shards'
-- lease rows and the clock the failed statement compared them with (:now when it had one).
SELECT shard, token, holder, expires_at, coalesce(CAST(:now AS timestamptz), now())
FROM {schema}.relay_lease
WHERE relay_group = :group AND shard = ANY(CAST(:shards AS integer[]));

-- name: lease_release
UPDATE {schema}.relay_lease
SET holder = NULL, expires_at = now()
WHERE relay_group = :group AND shard = :shard AND token = :token
RETURNING token;

-- name: claim_batch
-- Pending rows by state (never an id cursor): a row of a transaction still open is invisible now
-- and found by a later claim once it commits. Keys with a parked row wait (policy 'wait').
-- in_flight: rows sent but not marked yet (the open Kafka transaction's, or the one whose mark is
-- still running), left out by a hashed lookup. Never a lower id bound: a row that committed late
-- below them comes before any newer row of its key (per-key order), so every claim starts from
-- the lowest pending id.
-- Empty headers come back as NULL: the relay then has no JSON to decode for the usual row.
-- Other headers come back as JSON text, decoded row by row by the relay: psycopg would decode
-- jsonb while fetching, and one row it cannot decode (nested deeper than Python's json goes)
-- failed every claim of the shard; decoded by the relay, that row alone is parked.
-- The event id comes back as text: the relay only ever sends it as text (a header, the
-- checkpoint), and a uuid object per row cost a tenth of the relay's CPU (load, then str()).
-- max_bytes: the claim also stops where the running sum of row sizes (payload, key and headers,
-- which the writer lets grow as large as a payload) passes it, so memory is bounded by bytes, not
-- only rows; the first row always comes (a large row is never stuck). octet_length of a bytea
-- reads the TOAST header only (headers are read to be sent anyway); the window streams in index
-- order. The last column, the running sum, tells the relay how full the claim came back.
SELECT c.id, CAST(c.event_id AS text), c.idempotency_key, c.topic, c.message_key, c.payload,
       c.content_type, c.headers, c.event_type, c.schema_version,
       c.aggregate_type, c.aggregate_id, c.attempts, c.running
FROM (
SELECT m.id, m.event_id, m.idempotency_key, m.topic, m.message_key, m.payload, m.content_type,
       h.headers, m.event_type, m.schema_version, m.aggregate_type, m.aggregate_id, m.attempts,
       z.size, sum(z.size) OVER (ORDER BY m.shard, m.id) AS running
FROM {schema}.outbox_message m
-- The headers' text once per row (OFFSET 0 keeps the planner from copying the expression into
-- both of its uses); the size counts it.
CROSS JOIN LATERAL (SELECT CAST(nullif(m.headers, '{}'::jsonb) AS text) AS headers OFFSET 0) h
CROSS JOIN LATERAL (SELECT octet_length(m.payload) + coalesce(octet_length(m.message_key), 0)
    + coalesce(octet_length(h.headers), 0) AS size) z
-- "shard BETWEEN x AND x" and "ORDER BY shard, id" (not "shard = x", "ORDER BY id") on purpose:
-- only the partial pending index (shard, id) can deliver that order, so the planner never walks
-- the primary key past every already-published row (with stale statistics after a large
-- backlog it would, and each claim would cost O(table) instead of O(batch)).
WHERE m.shard BETWEEN :shard AND :shard AND m.state = 'pending'
  -- A worker of a shard the count no longer has (lowered while it ran) claims nothing: such
  -- rows are shard 0's to park (park_stray); two holders must never send one row.
  AND :shard < (SELECT shard_count FROM {schema}.outbox_setting)
  -- Due by the database clock (:now instead in tests; NULL in production).
  AND (m.deliver_after IS NULL OR m.deliver_after <= coalesce(CAST(:now AS timestamptz), now()))
  AND (m.next_attempt_at IS NULL
       OR m.next_attempt_at <= coalesce(CAST(:now AS timestamptz), now()))
  AND (:skip_parked_keys OR m.message_key IS NULL OR NOT EXISTS (
        SELECT 1 FROM {schema}.outbox_message p
        WHERE p.shard = m.shard AND p.state = 'parked' AND p.message_key = m.message_key))
  AND m.id NOT IN (SELECT unnest(CAST(:in_flight AS bigint[])))
ORDER BY m.shard, m.id
LIMIT :limit
) c
WHERE c.running <= :max_bytes OR c.running = c.size
ORDER BY c.id;

-- name: _lease_held
-- A fragment: the fencing check every relay write starts with (WITH <fragment>, ...). The
-- caller's token is the current one and unexpired by the database clock (by :now when a test
-- passes one; NULL in production). FOR SHARE makes the write and a takeover's UPDATE of the
-- lease row serialise.
lease AS (
    SELECT 1 FROM {schema}.relay_lease
    WHERE relay_group = :group AND shard = :shard AND token = :token
      AND expires_at > coalesce(CAST(:now AS timestamptz), now())
    FOR SHARE
)

-- name: producer_slots_raise
-- An exactly-once takeover, before it uses a slot: the count of slots any holder of the shard
-- may have used since they were last fenced, raised to this holder's own (:slots); "changed" is
-- the count after that, up to which the takeover fences (relay/takeover.py).
WITH {_lease_held}, raised AS (
    INSERT INTO {schema}.relay_producer_slots AS s (relay_group, shard, slots)
    SELECT :group, :shard, :slots WHERE EXISTS (SELECT 1 FROM lease)
    ON CONFLICT (relay_group, shard) DO UPDATE SET slots = greatest(s.slots, excluded.slots)
    RETURNING s.slots
)
SELECT (SELECT count(*) FROM lease) AS held, coalesce((SELECT slots FROM raised), 0) AS changed;

-- name: producer_slots_fenced
-- Every slot above :slots was fenced by this term: only its own may be in use from now on.
WITH {_lease_held}, done AS (
    UPDATE {schema}.relay_producer_slots SET slots = :slots
    WHERE relay_group = :group AND shard = :shard AND EXISTS (SELECT 1 FROM lease)
    RETURNING 1
)
SELECT (SELECT count(*) FROM lease) AS held, (SELECT count(*) FROM done) AS changed;

-- name: mark_published
WITH {_lease_held}, done AS (
    UPDATE {schema}.outbox_message
    SET state = 'published', published_at = now(), attempts = attempts + 1, last_error = NULL,
        next_attempt_at = NULL
    WHERE id = ANY(:ids) AND state = 'pending' AND EXISTS (SELECT 1 FROM lease)
    RETURNING 1
)
SELECT (SELECT count(*) FROM lease) AS held, (SELECT count(*) FROM done) AS changed;

-- name: reconcile_published
-- Rows a committed Kafka transaction carried (from the checkpoint). Matching on (id, event_id)
-- makes a checkpoint of another database (a restored or recreated one) harmless; on the shard,
-- one of another shard or group (rows move between shards only when none is pending).
WITH {_lease_held}, carried AS (
    SELECT * FROM unnest(CAST(:ids AS bigint[]), CAST(:event_ids AS uuid[])) AS c(id, event_id)
), done AS (
    UPDATE {schema}.outbox_message m
    SET state = 'published', published_at = now(), attempts = attempts + 1, last_error = NULL,
        next_attempt_at = NULL
    FROM carried c
    WHERE m.id = c.id AND m.event_id = c.event_id AND m.shard = :shard AND m.state = 'pending'
      AND EXISTS (SELECT 1 FROM lease)
    RETURNING 1
)
SELECT (SELECT count(*) FROM lease) AS held, (SELECT count(*) FROM done) AS changed;

-- name: reconcile_deleted
WITH {_lease_held}, carried AS (
    SELECT * FROM unnest(CAST(:ids AS bigint[]), CAST(:event_ids AS uuid[])) AS c(id, event_id)
), done AS (
    DELETE FROM {schema}.outbox_message m
    USING carried c
    WHERE m.id = c.id AND m.event_id = c.event_id AND m.shard = :shard AND m.state = 'pending'
      AND EXISTS (SELECT 1 FROM lease)
    RETURNING 1
)
SELECT (SELECT count(*) FROM lease) AS held, (SELECT count(*) FROM done) AS changed;

-- name: delete_published
WITH {_lease_held}, done AS (
    DELETE FROM {schema}.outbox_message
    WHERE id = ANY(:ids) AND state = 'pending' AND EXISTS (SELECT 1 FROM lease)
    RETURNING 1
)
SELECT (SELECT count(*) FROM lease) AS held, (SELECT count(*) FROM done) AS changed;

-- name: park
WITH {_lease_held}, done AS (
    UPDATE {schema}.outbox_message
    SET state = 'parked', parked_reason = :reason, parked_at = now(), last_error = :reason,
        attempts = attempts + 1
    WHERE id = :id AND state = 'pending' AND EXISTS (SELECT 1 FROM lease)
    RETURNING 1
)
SELECT (SELECT count(*) FROM lease) AS held, (SELECT count(*) FROM done) AS changed;

-- name: record_failure
WITH {_lease_held}, done AS (
    UPDATE {schema}.outbox_message
    SET attempts = attempts + 1, last_error = :error
    WHERE id = ANY(:ids) AND state = 'pending' AND EXISTS (SELECT 1 FROM lease)
    RETURNING 1
)
SELECT (SELECT count(*) FROM lease) AS held, (SELECT count(*) FROM done) AS changed;

-- name: schedule_rows
-- Rows scheduled for later leave the pending rows while they wait, and come back shortly before
-- they are due (migration 0008): every claim walks its shard's pending rows in id order, and
-- reads each waiting row below the first one due. A row whose deliver_after is more than
-- :ahead_seconds past the database clock (:now in tests) goes to 'scheduled'; one within that
-- (or whose deliver_after was cleared by hand) comes back to 'pending' with its id, ahead of its
-- time by up to :ahead_seconds (more than the interval between passes): the claim's own test of
-- deliver_after then lets it go when due, in its place among its key's due rows, as before.
-- At most :limit rows each way; a row another transaction holds is skipped (the next pass takes
-- it). Rows a writer has not committed yet are invisible here and wait in 'pending' until the
-- next pass. Only while nothing is in flight (no Kafka transaction open, no mark outstanding).
-- Each move reads only the rows it moves, from outbox_message_schedule_idx: run after
-- pending_walk_only, in the same transaction (else, with statistics that do not know the rows
-- yet, the planner may walk the shard's whole pending index, or the whole table).
WITH {_lease_held}, clock AS (
    SELECT coalesce(CAST(:now AS timestamptz), now())
           + make_interval(secs => :ahead_seconds) AS ahead
), later AS (
    SELECT m.id FROM {schema}.outbox_message m
    WHERE m.shard = :shard AND m.state = 'pending' AND m.deliver_after IS NOT NULL
      AND m.deliver_after > (SELECT ahead FROM clock) AND EXISTS (SELECT 1 FROM lease)
    ORDER BY m.shard, m.state, m.deliver_after
    LIMIT :limit
    FOR UPDATE OF m SKIP LOCKED
), due AS (
    SELECT m.id FROM {schema}.outbox_message m
    WHERE m.shard = :shard AND m.state = 'scheduled'
      AND m.deliver_after <= (SELECT ahead FROM clock) AND EXISTS (SELECT 1 FROM lease)
    ORDER BY m.shard, m.state, m.deliver_after
    LIMIT :limit
    FOR UPDATE OF m SKIP LOCKED
), cleared AS (
    SELECT m.id FROM {schema}.outbox_message m
    WHERE m.shard = :shard AND m.state = 'scheduled' AND m.deliver_after IS NULL
      AND EXISTS (SELECT 1 FROM lease)
    LIMIT :limit
    FOR UPDATE OF m SKIP LOCKED
), moved AS (
    UPDATE {schema}.outbox_message m
    SET state = CASE WHEN m.state = 'pending' THEN 'scheduled' ELSE 'pending' END
    FROM (SELECT id FROM later UNION ALL SELECT id FROM due UNION ALL SELECT id FROM cleared) x
    WHERE m.id = x.id
    RETURNING m.state
)
SELECT (SELECT count(*) FROM lease) AS held,
       (SELECT count(*) FROM moved WHERE state = 'scheduled') AS waiting,
       (SELECT count(*) FROM moved WHERE state = 'pending') AS due;

-- name: parked_lock
-- The first statement of every transaction that decides about a shard's held rows (migration
-- 0009): a hold pass (parked_try_lock), `outbox retry` and `outbox discard` (with held_release;
-- one lock for each shard of the rows they change, in ascending order), a deletion of parked
-- rows by the shard's housekeeping (housekeeping_delete_parked). Each waits here for any other
-- to commit, so its later statements (each with a snapshot taken after this one) see what the
-- other changed: two at once would each still see the other's parked row, and leave the held
-- rows behind it held while a newer row of their key goes out. Taken before any row lock (the
-- lease row's FOR SHARE comes after), so it never closes a cycle with them. One lock per
-- (schema, shard): :name is outboxkit.schema.parked_lock_name. No privilege needed.
SELECT pg_advisory_xact_lock(hashtext(:name), :shard);

-- name: parked_try_lock
-- parked_lock for a hold pass, not waited for: while an operator's retry or discard holds it,
-- the pass moves no held rows (the next one does) and the shard's claims go on.
SELECT pg_try_advisory_xact_lock(hashtext(:name), :shard);

-- name: parked_shards
-- The shards of the parked rows `outbox retry` or `outbox discard` is about to change, in
-- ascending order: the order it takes their parked_lock in. Read before the locks: a row parked
-- in another shard meanwhile is left as it is (parked_retry and parked_discard change rows of
-- these shards only), for the next command.
SELECT DISTINCT shard FROM {schema}.outbox_message
WHERE state = 'parked' AND (:all OR id = ANY(:ids))
ORDER BY shard;

-- name: hold_rows
-- Rows behind a parked row of their key (policy 'wait') wait in 'held' (migration 0009): the
-- claim tests every keyed row it walks for a parked row of its key, and 100,000 rows behind one
-- parked key made each claim of the shard take about 26 ms instead of 2. Up to :limit such rows
-- among the first :window pending rows (the front of the claim's walk) go to 'held', keeping their
-- ids; a retry or discard of the parked row brings them back in its own transaction (held_release,
-- housekeeping_delete_parked). Only once parked_try_lock took the shard's lock (the first
-- statement of schedule's transaction); after pending_walk_only; only while nothing is in flight.
WITH {_lease_held}, parked AS (
    SELECT p.message_key FROM {schema}.outbox_message p
    WHERE p.shard = :shard AND p.state = 'parked' AND p.message_key IS NOT NULL
      AND NOT :skip_parked_keys
      AND :shard < (SELECT shard_count FROM {schema}.outbox_setting)
      AND EXISTS (SELECT 1 FROM lease)
), front AS (
    SELECT m.id, m.message_key FROM {schema}.outbox_message m
    WHERE m.shard BETWEEN :shard AND :shard AND m.state = 'pending'
      AND EXISTS (SELECT 1 FROM parked)
    ORDER BY m.shard, m.id
    LIMIT :window
), moved AS (
    UPDATE {schema}.outbox_message m
    SET state = 'held'
    WHERE m.id IN (
        SELECT f.id FROM front f WHERE f.message_key IN (SELECT message_key FROM parked)
        LIMIT :limit)
      AND m.state = 'pending'
    RETURNING 1
)
SELECT (SELECT count(*) FROM lease) AS held, (SELECT count(*) FROM moved) AS changed;

-- name: held_keys_walk
-- One step of the walk of the shard's held keys: up to :limit keys after :after (NULL: from
-- the first), in key order, each with whether its rows may go back (held_orphans_release): no
-- parked row of it is left (one deleted or changed by hand), or the policy is 'skip'.
-- Read-only, one index probe per key (a loose scan of outbox_message_held_idx). Each step goes
-- on after the last one's keys (ShardStore keeps the place), so a walk reads each key once:
-- walking every key at each statement cost O(keys) a pass and O(keys²) to let them go (every
-- key left read again for each 1,000 rows: 100,000 keys took 98 s, the shard publishing
-- nothing meanwhile).
WITH RECURSIVE held_keys(message_key, n) AS (
    (SELECT h.message_key, 1 FROM {schema}.outbox_message h
     WHERE h.shard = :shard AND h.state = 'held' AND CAST(:after AS text) IS NULL
     ORDER BY h.shard, h.message_key, h.id LIMIT 1)
    UNION ALL
    (SELECT h.message_key, 1 FROM {schema}.outbox_message h
     WHERE h.shard = :shard AND h.state = 'held' AND h.message_key > CAST(:after AS text)
     ORDER BY h.shard, h.message_key, h.id LIMIT 1)
    UNION ALL
    SELECT (SELECT h.message_key FROM {schema}.outbox_message h
            WHERE h.shard = :shard AND h.state = 'held' AND h.message_key > k.message_key
            ORDER BY h.shard, h.message_key, h.id LIMIT 1), k.n + 1
    FROM held_keys k WHERE k.message_key IS NOT NULL AND k.n < :limit
)
SELECT k.message_key, :skip_parked_keys OR NOT EXISTS (
    SELECT 1 FROM {schema}.outbox_message p
    WHERE p.shard = :shard AND p.state = 'parked' AND p.message_key = k.message_key)
FROM held_keys k WHERE k.message_key IS NOT NULL;

-- name: held_orphans_release
-- The held rows of the shard under :keys (a step of held_keys_walk) back to pending, with their
-- ids, oldest first and at most :limit of them (ten a key of the step): a key may hold millions
-- (one parked for hours under load), and one statement for them all would hold the lease row
-- (lease_held) for longer than a lease lasts. The pass repeats the step until fewer come back.
-- Rows of a key that meanwhile has a parked row again stay.
WITH {_lease_held}, chosen AS (
    SELECT m.id FROM {schema}.outbox_message m
    WHERE m.shard = :shard AND m.state = 'held'
      AND m.message_key = ANY(CAST(:keys AS text[])) AND EXISTS (SELECT 1 FROM lease)
      AND (:skip_parked_keys OR NOT EXISTS (
        SELECT 1 FROM {schema}.outbox_message p
        WHERE p.shard = m.shard AND p.state = 'parked' AND p.message_key = m.message_key))
    ORDER BY m.id
    LIMIT :limit
), moved AS (
    UPDATE {schema}.outbox_message m
    SET state = 'pending'
    FROM chosen c
    WHERE m.id = c.id AND m.state = 'held'
    RETURNING 1
)
SELECT (SELECT count(*) FROM lease) AS held, (SELECT count(*) FROM moved) AS changed;

-- name: retention_delete
-- One small batch of published rows older than the window; the holder of the shard repeats it.
-- Shard 0's holder also takes rows of no shard (outside 0 .. shard_count - 1: left behind when
-- `relay shards` lowered the count): no other holder would, and shard 0's walk of the
-- published index would pass over them for ever. One walk either way (the index is on
-- published_at alone).
WITH {_lease_held}, victims AS (
    SELECT id FROM {schema}.outbox_message
    WHERE state = 'published'
      AND (shard = :shard OR (:shard = 0 AND (shard < 0
           OR shard >= (SELECT shard_count FROM {schema}.outbox_setting))))
      AND published_at
          < coalesce(CAST(:now AS timestamptz), now()) - :keep_seconds * interval '1 second'
      AND EXISTS (SELECT 1 FROM lease)
    ORDER BY published_at
    LIMIT :limit
), done AS (
    DELETE FROM {schema}.outbox_message m USING victims v WHERE m.id = v.id RETURNING 1
)
SELECT (SELECT count(*) FROM lease) AS held, (SELECT count(*) FROM done) AS changed;

-- name: listen
-- The schema's LISTEN/NOTIFY channel (outboxkit.schema.notify_channel), quoted by the loader.
LISTEN {channel};

-- name: control_paused
SELECT coalesce((SELECT paused FROM {schema}.relay_control WHERE relay_group = :group), false);

-- name: control_set
INSERT INTO {schema}.relay_control (relay_group, paused, reason, changed_by, changed_at)
VALUES (:group, :paused, :reason, :changed_by, now())
ON CONFLICT (relay_group) DO UPDATE
SET paused = excluded.paused, reason = excluded.reason, changed_by = excluded.changed_by,
    changed_at = now();

-- name: _shard_holders
-- A fragment (WITH <fragment>, ...): every shard of the group, its lease (if any) and parked
-- rows. Cheap whatever the backlog: parked rows are few and have their own partial index.
-- Parked rows of no shard (park_stray) count under shard 0, whose holder parked them and
-- sweeps them: else no gauge, status line or alert would show them.
-- counts: whether the relay process :holder reports this shard's backlog: a shard it holds, or
-- one nobody holds (every process then reports it, so /healthz anywhere sees it). A NULL
-- :holder (the status command) counts every shard. So a held shard's backlog is walked by its
-- holder alone, not by every relay process.
-- active: an unexpired lease by the database clock (by :now when a test passes one; NULL in
-- production).
leases AS (
    SELECT s.shard, l.holder, l.token, l.expires_at,
           (l.holder IS NOT NULL AND l.expires_at > coalesce(CAST(:now AS timestamptz), now()))
           AS active,
           (SELECT count(*) FROM {schema}.outbox_message m
            WHERE m.shard = s.shard AND m.state = 'parked')
           + (SELECT count(*) FROM {schema}.outbox_message m
              WHERE s.shard = 0 AND m.state = 'parked'
                AND (m.shard < 0 OR m.shard >= (SELECT shard_count FROM {schema}.outbox_setting))
             ) AS parked
    FROM generate_series(0, (SELECT shard_count FROM {schema}.outbox_setting) - 1) AS s(shard)
    LEFT JOIN {schema}.relay_lease l ON l.relay_group = :group AND l.shard = s.shard
),
holders AS (
    SELECT shard, holder, token, expires_at, active, parked,
           (CAST(:holder AS text) IS NULL OR NOT active OR holder = :holder) AS counts
    FROM leases
)

-- name: holders
WITH {_shard_holders}
SELECT shard, active, parked, counts FROM holders ORDER BY shard;

-- name: status
-- One row per shard: its lease (if any), backlog and oldest pending age (NULL where not walked),
-- parked count, counts (see the holders fragment) and walked. The age is counted from :now
-- (NULL in production: the database clock).
-- walked: counts, and the shard is in :only (a NULL :only: every shard that counts). A relay
-- process counts a shard that just became its to count alone, without walking the others.
-- The age runs from when a row became due: its deliver_after when later than its creation, so a
-- row scheduled days ago does not look days old in the seconds between its return to pending
-- (scheduling) and its send, and one not due yet counts as 0 (a steady stream of scheduled rows
-- had kept the age at their scheduling distance, and an age alert firing). A row waiting on
-- next_attempt_at (a failed send's back-off) keeps its age: it is late.
-- The backlog and its oldest row come from one walk of the shard's pending rows in the partial
-- pending index. Run it after pending_walk_only, in the same transaction: with statistics that
-- still count a drained backlog as pending, the planner otherwise reads the whole table for
-- each shard (a sequential or bitmap scan). A shard not walked is not read at all (walked is a
-- one-time filter of the walk).
WITH {_shard_holders},
scope AS (
    SELECT h.*,
           h.counts AND (CAST(:only AS smallint[]) IS NULL OR h.shard = ANY(:only)) AS walked
    FROM holders h
)
SELECT h.shard, h.holder, h.token, h.expires_at, h.active,
       CASE WHEN h.walked THEN p.backlog END AS backlog,
       -- NULL when nothing is pending (greatest ignores a NULL: it would make that 0).
       CASE WHEN h.walked AND p.oldest IS NOT NULL
            THEN greatest(0, extract(epoch FROM
                                     coalesce(CAST(:now AS timestamptz), now()) - p.oldest))
       END AS oldest_pending_seconds,
       h.parked, h.counts, h.walked
FROM scope h
CROSS JOIN LATERAL (
    SELECT count(*) AS backlog, min(o.due) AS oldest
    FROM (
        SELECT greatest(m.created_at, m.deliver_after) AS due FROM {schema}.outbox_message m
        -- The claim's form (see claim_batch): only the partial pending index gives this order.
        WHERE h.walked AND m.shard BETWEEN h.shard AND h.shard AND m.state = 'pending'
        ORDER BY m.shard, m.id
    ) o
) p
ORDER BY h.shard;

-- name: pending_walk_only
-- For the rest of this transaction the planner may only walk indexes, in their order: status's
-- count of a backlog is then the pending index's entries, whatever the statistics say, and
-- schedule_rows reads only the schedule index and the rows it moves. JIT off too: a plan that
-- reads a one-row table (outbox_setting) has a seq scan's disabling cost (10^10) in its
-- estimate, far past jit_above_cost, and compiling it took about 300 ms for a statement of 1.
SELECT set_config('enable_seqscan', 'off', true), set_config('enable_bitmapscan', 'off', true),
       set_config('enable_sort', 'off', true), set_config('jit', 'off', true);

-- name: parked_list
-- The first :limit parked rows, each with how many are parked in all (one snapshot): the limit
-- must not pass for the total. No row listed (none parked, or a limit of 0): one row of NULLs
-- with the total.
SELECT r.id, r.event_id, r.topic, r.message_key, r.shard, r.attempts, r.parked_reason,
       r.parked_at, t.total
FROM (SELECT count(*) AS total FROM {schema}.outbox_message WHERE state = 'parked') t
LEFT JOIN LATERAL (
    SELECT id, event_id, topic, message_key, shard, attempts, parked_reason, parked_at
    FROM {schema}.outbox_message
    WHERE state = 'parked'
    ORDER BY id
    LIMIT :limit
) r ON true
ORDER BY r.id;

-- name: parked_retry
-- Operator action: give parked rows back to the relay; same-key rows behind them follow in order.
-- A row of no shard (park_stray) gets its key's shard.
UPDATE {schema}.outbox_message m
SET state = 'pending', parked_reason = NULL, parked_at = NULL, next_attempt_at = NULL,
    shard = CASE WHEN m.shard >= 0 AND m.shard < s.shard_count THEN m.shard
                 ELSE {schema}.outbox_shard(m.message_key, m.event_id, s.shard_count) END
FROM {schema}.outbox_setting s
WHERE m.state = 'parked' AND (:all OR m.id = ANY(:ids))
  AND m.shard = ANY(CAST(:shards AS integer[]))  -- those locked (parked_shards): see parked_lock
RETURNING m.id;

-- name: held_release
-- After parked_retry or parked_discard, in their transaction: rows held behind a parked row
-- (hold_rows) whose key has no parked row left go back to pending, with their ids, so they go
-- before any newer row of their key. After parked_lock for each of :shards (parked_shards): no
-- hold pass of those shards runs until this transaction ends. Reads
-- every held row of those shards (an operator's command, not a relay's loop).
UPDATE {schema}.outbox_message h
SET state = 'pending'
WHERE h.state = 'held' AND h.shard = ANY(CAST(:shards AS integer[])) AND NOT EXISTS (
    SELECT 1 FROM {schema}.outbox_message p
    WHERE p.shard = h.shard AND p.state = 'parked' AND p.message_key = h.message_key)
RETURNING h.id;

-- name: parked_discard
-- A row of no shard gets its key's shard, so that shard's housekeeping deletes it in time.
UPDATE {schema}.outbox_message m
SET state = 'discarded',
    shard = CASE WHEN m.shard >= 0 AND m.shard < s.shard_count THEN m.shard
                 ELSE {schema}.outbox_shard(m.message_key, m.event_id, s.shard_count) END
FROM {schema}.outbox_setting s
WHERE m.state = 'parked' AND (:all OR m.id = ANY(:ids))
  AND m.shard = ANY(CAST(:shards AS integer[]))  -- those locked (parked_shards): see parked_lock
RETURNING m.id;

-- name: park_stray
-- Housekeeping by shard 0's holder: pending (or scheduled) rows of no shard (outside 0 .. shard_count - 1: not
-- written by outboxkit's writer) would wait for ever, seen by no relay and no metric. They are
-- parked with the reason, a small batch per statement (the lease row stays shared meanwhile);
-- `outbox retry` gives them their key's shard. No worker claims them (claim_batch). They keep
-- their shard number (the reason names it; rows of their key's shard do not wait behind them)
-- and count under shard 0 (_shard_holders, housekeeping_delete_*).
-- Rows scheduled for later of no shard too (moved to 'scheduled' under a larger shard count): no
-- holder would bring them back.
-- Each bound on its own, against the partial pending index (shard, id) or the schedule index: a
-- join or an ORDER BY id let the planner walk the primary key through every published row.
WITH {_lease_held}, setting AS (SELECT shard_count FROM {schema}.outbox_setting), victims AS (
    (SELECT m.id FROM {schema}.outbox_message m
     WHERE m.state = 'pending' AND m.shard >= (SELECT shard_count FROM setting)
       AND EXISTS (SELECT 1 FROM lease)
     LIMIT :limit)
    UNION ALL
    (SELECT m.id FROM {schema}.outbox_message m
     WHERE m.state = 'pending' AND m.shard < 0 AND EXISTS (SELECT 1 FROM lease)
     LIMIT :limit)
    UNION ALL
    (SELECT m.id FROM {schema}.outbox_message m
     WHERE m.state = 'scheduled' AND m.shard >= (SELECT shard_count FROM setting)
       AND EXISTS (SELECT 1 FROM lease)
     LIMIT :limit)
    UNION ALL
    (SELECT m.id FROM {schema}.outbox_message m
     WHERE m.state = 'scheduled' AND m.shard < 0 AND EXISTS (SELECT 1 FROM lease)
     LIMIT :limit)
    LIMIT :limit
), done AS (
    UPDATE {schema}.outbox_message m
    SET state = 'parked', parked_at = now(), attempts = m.attempts + 1,
        parked_reason = format('STRAY_SHARD: shard %s is outside 0..%s (the row was not written'
                               ' by the outboxkit writer)', m.shard, s.shard_count - 1),
        last_error = format('STRAY_SHARD: shard %s is outside 0..%s', m.shard, s.shard_count - 1)
    FROM victims v, setting s
    WHERE m.id = v.id AND m.state IN ('pending', 'scheduled')
    RETURNING 1
)
SELECT (SELECT count(*) FROM lease) AS held, (SELECT count(*) FROM done) AS changed;

-- name: _housekeeping_victims
-- The rest of a sweep's row test and its batch (housekeeping_delete_*): this shard's rows, and
-- for shard 0's holder rows of no shard too (parked strays; rows of shards a lowered count left
-- behind), which no other holder would take; parked longer ago than the window.
(shard = :shard OR (:shard = 0 AND (shard < 0
     OR shard >= (SELECT shard_count FROM {schema}.outbox_setting))))
AND coalesce(parked_at, created_at)
    < coalesce(CAST(:now AS timestamptz), now()) - :keep_seconds * interval '1 second'
AND EXISTS (SELECT 1 FROM lease)
ORDER BY id
LIMIT :limit

-- name: housekeeping_delete_discarded
-- Housekeeping (outboxkit.relay.housekeeping): one small batch of this shard's rows in a final
-- state other than published, token-conditional like every relay write. One statement per
-- state, its state written in it (not a parameter), so every plan the server may choose for it,
-- a generic one too (plan_cache_mode, or after five runs of a prepared statement), can use the
-- state's partial index: (shard, id) for discarded rows (migration 0005), (shard, message_key)
-- for parked ones. No published row kept for retention is read.
WITH {_lease_held}, victims AS (
    SELECT id FROM {schema}.outbox_message
    WHERE state = 'discarded' AND {_housekeeping_victims}
), done AS (
    DELETE FROM {schema}.outbox_message m USING victims v
    WHERE m.id = v.id AND m.state = 'discarded'
    RETURNING 1
)
SELECT (SELECT count(*) FROM lease) AS held, (SELECT count(*) FROM done) AS changed;

-- name: housekeeping_delete_parked
-- housekeeping_delete_discarded for parked rows (only with parked_retention_seconds).
WITH {_lease_held}, victims AS (
    SELECT id FROM {schema}.outbox_message
    WHERE state = 'parked' AND {_housekeeping_victims}
), done AS (
    DELETE FROM {schema}.outbox_message m USING victims v
    WHERE m.id = v.id AND m.state = 'parked'
    RETURNING m.shard, m.message_key
), released AS (
    -- Rows held behind them (hold_rows) go back to pending with their deletion, unless another
    -- row of their key stays parked.
    UPDATE {schema}.outbox_message h
    SET state = 'pending'
    FROM (SELECT DISTINCT shard, message_key FROM done WHERE message_key IS NOT NULL) d
    WHERE h.state = 'held' AND h.shard = d.shard AND h.message_key = d.message_key
      AND NOT EXISTS (
        SELECT 1 FROM {schema}.outbox_message p
        WHERE p.shard = h.shard AND p.state = 'parked' AND p.message_key = h.message_key
          AND p.id NOT IN (SELECT id FROM victims))
    RETURNING 1
)
SELECT (SELECT count(*) FROM lease) AS held, (SELECT count(*) FROM done) AS changed;

-- name: shards_lock_timeout
-- `outboxkit relay shards N`, in one short transaction as the schema owner: wait for writers in
-- flight to finish and hold new ones back (SHARE conflicts with INSERT's ROW EXCLUSIVE), at
-- most a few seconds, so no row is written with the old count after the check below. Also
-- `outbox retry` and `outbox discard`: their parked_lock waits as long at most.
SELECT set_config('lock_timeout', '5s', true);

-- name: shards_lock_table
LOCK TABLE {schema}.outbox_message IN SHARE MODE;

-- name: shards_blockers
-- Rows still to publish: the switch would move their keys to another shard, and rows written
-- after it could overtake them. Parked rows count too (a retry would publish them late), and
-- scheduled and held ones (pending rows that wait for their time, or behind a parked row).
SELECT state, count(*) FROM {schema}.outbox_message
WHERE state IN ('pending', 'parked', 'scheduled', 'held')
GROUP BY state ORDER BY state;

-- name: shards_set
UPDATE {schema}.outbox_setting SET shard_count = :count RETURNING shard_count;
