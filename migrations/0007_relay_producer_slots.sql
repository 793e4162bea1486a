-- outboxkit 0007: the transactional ids a shard's earlier holders may have used.

-- An exactly-once holder uses producers_per_shard transactional ids (slots) in turn, and a
-- takeover fences the old holder's producers by initialising each id again. A holder started
-- with fewer slots than the one before (producers_per_shard lowered) would leave the old
-- holder's other ids unfenced: a zombie stalled inside a commit on one of them could still
-- commit after the takeover and send its rows twice. A takeover raises this count to its own
-- before it uses a slot, fences every slot below it, then records its own count.
-- A table of its own, not a column of relay_lease: creating it takes no lock that renewals
-- would queue behind. A shard without a row has no recorded history (nothing extra fenced).
CREATE TABLE relay_producer_slots (
    relay_group text    NOT NULL,
    shard       integer NOT NULL,
    slots       integer NOT NULL CHECK (slots >= 0),
    PRIMARY KEY (relay_group, shard)
);
