-- Statements about a session of ours, whatever the schema.

-- name: default_isolation
-- The level a statement sent on its own (autocommit) runs at: see outboxkit.db.own_transaction.
SELECT current_setting('default_transaction_isolation')
