"""Open files a relay process needs for the shards it may hold, against its limit.

Every held shard keeps Kafka producers (``producers_per_shard`` in exactly-once mode, one
otherwise), each with sockets to the brokers and librdkafka's wake-up pipes, besides its
database connection: about 23 open files per shard with two confluent-kafka producers on a
one-broker cluster (measured), more with more brokers. Under a soft limit of 1,024 (systemd's
default, some container images) a process taking 64 shards ran out: librdkafka could open no
socket, lease renewals failed, shards were lost and taken again, and nothing was published,
with nothing at start-up to say why.

So ``relay run`` (a process of its own) raises its soft limit to the hard one, at most
:data:`RAISED_AT_MOST` (raising it costs nothing, and the estimate below is low on clusters of
many brokers); an embedded relay leaves its host's limit alone. Either way a limit below the
estimate for the shards the process may hold is said once, with the figures.
"""

from __future__ import annotations

import logging
import resource

logger = logging.getLogger("outboxkit.relay")

#: Open files per Kafka producer on a small cluster (sockets, wake-up pipes; measured 10.5).
FILES_PER_PRODUCER = 11
#: Open files of the process besides its shards (logs, the database listener, metrics, Python).
FILES_BASE = 64
#: ``relay run`` raises its soft limit to the hard one, but not past this.
RAISED_AT_MOST = 65_536


def files_needed(shards: int, producers: int) -> int:
    """An estimate for ``shards`` held shards of ``producers`` producers each (one database
    connection and a checkpoint read now and then besides)."""
    return FILES_BASE + shards * (producers * FILES_PER_PRODUCER + 2)


def raise_open_files_limit() -> None:
    """``relay run``: the soft open-files limit raised to the hard one (at most
    :data:`RAISED_AT_MOST`)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = RAISED_AT_MOST if hard == resource.RLIM_INFINITY else min(hard, RAISED_AT_MOST)
    if soft == resource.RLIM_INFINITY or soft >= target:
        return
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError) as exc:
        logger.info("could not raise the open-files limit from %d: %s", soft, exc)
    else:
        logger.info("open-files limit raised from %d to %d", soft, target)


def check_open_files(shards: int, producers: int) -> None:
    """A WARNING, with the figures, when the soft limit is below the estimate."""
    need = files_needed(shards, producers)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return
    logger.warning(
        "this relay may need about %d open files for %d shard(s) (%d per shard, more with many"
        " brokers) but may open only %d (hard limit %s): past that it can open no Kafka or"
        " database connection and publishes nothing; raise the limit (ulimit -n, systemd"
        " LimitNOFILE=) or lower max_shards_per_process",
        need,
        shards,
        (need - FILES_BASE) // max(shards, 1),
        soft,
        "unlimited" if hard == resource.RLIM_INFINITY else hard,
    )
