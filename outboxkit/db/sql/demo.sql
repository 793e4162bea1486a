-- The demo's live view (``outboxkit demo``): one round trip per redraw.

-- name: progress
-- Published rows of the run's topic, the run's consumer's finished events and suppressed
-- redeliveries, shard 0's lease (holder only while unexpired), the database clock, and how many
-- relay processes hold their lease-attempt connection (each relay keeps one).
SELECT
  (SELECT count(*) FROM {schema}.outbox_message WHERE topic = :topic AND state = 'published'),
  (SELECT count(*) FROM {schema}.inbox_message WHERE consumer = :consumer
     AND state = 'succeeded'),
  (SELECT coalesce(sum(duplicate_count), 0) FROM {schema}.inbox_message
     WHERE consumer = :consumer),
  (SELECT holder FROM {schema}.relay_lease WHERE relay_group = :group AND shard = 0
     AND holder IS NOT NULL AND expires_at > now()),
  (SELECT token FROM {schema}.relay_lease WHERE relay_group = :group AND shard = 0),
  (SELECT acquired_at FROM {schema}.relay_lease WHERE relay_group = :group AND shard = 0),
  now(),
  (SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
     AND application_name = 'outboxkit-relay-standby');
