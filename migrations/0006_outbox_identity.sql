-- outboxkit 0006: the outbox's identity, for the checkpoints of its exactly-once relay.

-- Checkpoint keys are <group>/<shard>: two outboxes whose relays share a group on one Kafka
-- cluster would read each other's checkpoints. Each checkpoint records this id, and a relay
-- that finds another one under its key stops that shard and says why. Stored, not derived
-- (from the server's system identifier, the database's name), so it stays the same through a
-- rename, pg_upgrade, a dump and restore or a failover.
ALTER TABLE outbox_setting ADD COLUMN IF NOT EXISTS outbox_id uuid NOT NULL
    DEFAULT gen_random_uuid();
