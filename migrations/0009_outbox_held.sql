-- outboxkit 0009: rows waiting behind a parked row of their key wait in a state of their own.

-- Every claim walks its shard's pending rows in id order from the lowest, and tests each keyed
-- row for a parked row of its key: 100,000 rows behind one parked key made every claim of their
-- shard take about 26 ms instead of 2. The shard's holder now moves such rows to 'held' (out of
-- the pending index the claim walks); a retry or discard of the parked row moves them back to
-- 'pending' in its own transaction, where they keep their id and so their place in their key's
-- order.

-- The index the moves back read, by key. Fixed name and IF NOT EXISTS, as in 0005: on a large
-- outbox an operator builds it first with CREATE INDEX CONCURRENTLY under the same name. A
-- concurrent build that failed, or an index defined otherwise, is dropped and built again here.
DO $$
BEGIN
    IF EXISTS (
        SELECT FROM pg_index AS i
        WHERE i.indexrelid = to_regclass('outbox_message_held_idx')
          AND (NOT i.indisvalid
               OR pg_get_indexdef(i.indexrelid) NOT LIKE 'CREATE INDEX outbox_message_held_idx'
                      || ' ON %.outbox_message USING btree (shard, message_key, id)'
                      || ' WHERE (state = ''held''::text)')
    ) THEN
        DROP INDEX outbox_message_held_idx;
    END IF;
END
$$;

CREATE INDEX IF NOT EXISTS outbox_message_held_idx
    ON outbox_message (shard, message_key, id) WHERE state = 'held';

-- The new state, as in 0008: every check constraint on the state is replaced, whatever its name.
DO $$
DECLARE
    found record;
BEGIN
    FOR found IN
        SELECT c.conname FROM pg_constraint AS c
        WHERE c.conrelid = to_regclass('outbox_message') AND c.contype = 'c'
          AND c.conkey = ARRAY[(SELECT a.attnum FROM pg_attribute AS a
                                WHERE a.attrelid = c.conrelid AND a.attname = 'state')]
    LOOP
        EXECUTE format('ALTER TABLE outbox_message DROP CONSTRAINT %I', found.conname);
    END LOOP;
END
$$;
ALTER TABLE outbox_message ADD CONSTRAINT outbox_message_state_check
    CHECK (state IN ('pending', 'published', 'parked', 'discarded', 'scheduled', 'held'));
