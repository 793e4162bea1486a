"""Open files a relay process needs for the shards it may hold, against its limit.

Every shard holds Kafka clients (its producers, and a checkpoint reader in exactly-once mode),
each with sockets to the brokers and librdkafka's wake-up pipes, besides its database
connections: about 23 open files per shard with two producers (measured). Under a soft limit of
1,024 (systemd's default, some container images) a process taking 64 shards ran out: librdkafka
could open no socket, lease renewals failed, shards were lost and taken again, and nothing was
published, with nothing at start-up to say why. So the soft limit is raised as far as the hard
one allows, and a limit still too low is said once, with the figures.
"""

from __future__ import annotations

import logging
import resource

logger = logging.getLogger("outboxkit.relay")

#: Open files per Kafka client of a shard (sockets to a small cluster, wake-up pipes).
FILES_PER_CLIENT = 8
#: Open files of the process besides its shards (logs, the database listener, metrics, Python).
FILES_BASE = 64


def files_needed(shards: int, producers_per_shard: int, exactly_once: bool) -> int:
    clients = producers_per_shard + (1 if exactly_once else 0)
    return FILES_BASE + shards * (clients * FILES_PER_CLIENT + 2)


def ensure_open_files(shards: int, producers_per_shard: int, exactly_once: bool) -> int:
    """Raise the soft open-files limit to what ``shards`` need, up to the hard limit; a limit
    still short of it is logged as a WARNING. Returns the soft limit in force."""
    need = files_needed(shards, producers_per_shard, exactly_once)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return soft
    raised = need if hard == resource.RLIM_INFINITY else min(need, hard)
    if raised > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
        except (ValueError, OSError) as exc:
            logger.info("could not raise the open-files limit from %d: %s", soft, exc)
        else:
            logger.info(
                "open-files limit raised from %d to %d for %d shard(s)", soft, raised, shards
            )
            soft = raised
    if soft < need:
        logger.warning(
            "this relay may need about %d open files for %d shard(s) (%d per shard) but may open"
            " only %d (hard limit %s): past that it can open no Kafka or database connection and"
            " publishes nothing; raise the limit (ulimit -n, systemd LimitNOFILE=) or lower"
            " max_shards_per_process",
            need,
            shards,
            (need - FILES_BASE) // max(shards, 1),
            soft,
            "unlimited" if hard == resource.RLIM_INFINITY else hard,
        )
    return soft
