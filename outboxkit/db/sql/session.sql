-- Statements about a session of ours, whatever the schema.

-- name: default_isolation
-- The level a statement sent on its own (autocommit) runs at: see outboxkit.db.own_transaction.
SELECT current_setting('default_transaction_isolation')

-- name: migration_timeouts_off
-- The migrator's transaction waits for the advisory lock (another process migrating) and may
-- build an index on a big table: a lock_timeout or statement_timeout of the database or role
-- (set for the application) must not cut it. Local to the transaction (or the caller's, joined:
-- put back with migration_timeouts_back); returns what they were.
SELECT saved.lock_timeout, saved.statement_timeout,
       set_config('lock_timeout', '0', true), set_config('statement_timeout', '0', true)
FROM (
    SELECT current_setting('lock_timeout') AS lock_timeout,
           current_setting('statement_timeout') AS statement_timeout
    OFFSET 0
) saved

-- name: migration_timeouts_back
SELECT set_config('lock_timeout', :lock_timeout, true),
       set_config('statement_timeout', :statement_timeout, true)
