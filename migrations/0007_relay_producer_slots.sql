-- outboxkit 0007: the transactional ids a shard's earlier holders may have used.

-- An exactly-once holder uses producers_per_shard transactional ids (slots) in turn, and a
-- takeover fences the old holder's producers by initialising each id again. A holder started
-- with fewer slots than the one before (producers_per_shard lowered) would leave the old
-- holder's other ids unfenced: a zombie stalled inside a commit on one of them could still
-- commit after the takeover and send its rows twice. Every acquire raises this count to its own
-- before it uses a slot; a takeover fences every slot below it, then records its own count.
-- Rows from before this migration get 4, the most slots a shard may use
-- (MAX_PRODUCERS_PER_SHARD): their first takeover fences them all once.
ALTER TABLE relay_lease ADD COLUMN IF NOT EXISTS producer_slots integer NOT NULL DEFAULT 4
    CHECK (producer_slots >= 0);
