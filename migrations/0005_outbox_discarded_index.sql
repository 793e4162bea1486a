-- outboxkit 0005: an index of the discarded outbox rows, for the relay's housekeeping.

-- Housekeeping deletes each shard's discarded rows past their window, in id order. With no
-- index to find them, every sweep of every shard read the whole outbox table, the published
-- rows kept for their retention window included. Partial: a row enters it only when discarded,
-- so no insert and no publication writes to it.

-- Fixed name and IF NOT EXISTS, as in 0004: on a large outbox an operator builds it first with
-- CREATE INDEX CONCURRENTLY under the same name (here, in the migration's transaction, the
-- build blocks writes to the table). A concurrent build that failed leaves an invalid index
-- behind, which IF NOT EXISTS would keep: such an index, or one defined otherwise, is dropped
-- and built again here.
DO $$
BEGIN
    IF EXISTS (
        SELECT FROM pg_index AS i
        WHERE i.indexrelid = to_regclass('outbox_message_discarded_idx')
          AND (NOT i.indisvalid
               OR pg_get_indexdef(i.indexrelid) NOT LIKE 'CREATE INDEX outbox_message_discarded_idx'
                      || ' ON %.outbox_message USING btree (shard, id)'
                      || ' WHERE (state = ''discarded''::text)')
    ) THEN
        DROP INDEX outbox_message_discarded_idx;
    END IF;
END
$$;

CREATE INDEX IF NOT EXISTS outbox_message_discarded_idx
    ON outbox_message (shard, id) WHERE state = 'discarded';
