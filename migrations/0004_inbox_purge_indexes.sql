-- outboxkit 0004: the inbox purge indexes lead with the consumer.

-- Each consumer purges its own rows, for its own window. Indexed by finish time alone, one
-- consumer's purge walked every row another consumer still keeps and filtered it out, in every
-- batch. Led by the consumer, the purge is a range scan of that consumer's old rows.

-- Fixed names and IF NOT EXISTS: on a large inbox an operator builds these first with
-- CREATE INDEX CONCURRENTLY under the same names (here, in the migration's transaction, the
-- build blocks writes to the table). A concurrent build that failed leaves an invalid index
-- behind, which IF NOT EXISTS would keep: such an index, or one defined otherwise, is dropped
-- and built again here.
DO $$
DECLARE
    stale text;
BEGIN
    FOR stale IN
        SELECT wanted.name
        FROM (VALUES
            ('inbox_message_consumer_finished_idx', 'inbox_message',
             'USING btree (consumer, finished_at) WHERE (state <> ''processing''::text)'),
            ('inbox_rejection_consumer_created_idx', 'inbox_rejection',
             'USING btree (consumer, created_at)')
        ) AS wanted (name, on_table, definition)
        JOIN pg_index AS i ON i.indexrelid = to_regclass(quote_ident(wanted.name))
        WHERE NOT i.indisvalid
           OR pg_get_indexdef(i.indexrelid) NOT LIKE 'CREATE INDEX ' || wanted.name
                  || ' ON %.' || wanted.on_table || ' ' || wanted.definition
    LOOP
        EXECUTE format('DROP INDEX %I', stale);
    END LOOP;
END
$$;

CREATE INDEX IF NOT EXISTS inbox_message_consumer_finished_idx
    ON inbox_message (consumer, finished_at) WHERE state <> 'processing';
CREATE INDEX IF NOT EXISTS inbox_rejection_consumer_created_idx
    ON inbox_rejection (consumer, created_at);

-- Not kept beside the new ones: every finished inbox row would write one more index entry, on
-- the consumer's hot path, for a scan nothing runs any more.
DROP INDEX IF EXISTS inbox_message_finished_idx;
DROP INDEX IF EXISTS inbox_rejection_created_idx;
