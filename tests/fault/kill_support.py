"""The kill-and-succeed pattern of the relay fault tests, written once: a relay process that
SIGKILLs itself at a fault point, then a successor that must finish the work exactly once."""

from __future__ import annotations

import signal
from dataclasses import dataclass, field

from tests.relay_support import RelayProcess, assert_exactly_once_in_order, consume, row_states
from tests.support.waiting import wait_for


@dataclass
class KillRun:
    """One shard's rows published by relays started with the same ``args``/``env``/client."""

    db_url: str
    bootstrap: str
    processes: list[RelayProcess]
    client: str
    args: list[str]
    env: dict[str, str] = field(default_factory=dict)

    def killed_at(self, fault: str) -> RelayProcess:
        """A relay that dies (SIGKILL) at ``fault`` (``point:nth``); returned once dead."""
        victim = RelayProcess(
            self.db_url,
            self.bootstrap,
            self.args,
            env={**self.env, "OUTBOXKIT_FAULT": fault},
            client=self.client,
        )
        self.processes.append(victim.start())
        assert victim.wait_exit(120) == -signal.SIGKILL, victim.log()
        assert f"fault point {fault.split(':')[0]}" in victim.log(), victim.log()
        return victim

    def successor(self, victim: RelayProcess | None = None, **env: str) -> RelayProcess:
        """A relay reading the victim's checkpoints (exactly-once) that runs until stopped."""
        same = {"checkpoint_topic": victim.checkpoint_topic} if victim is not None else {}
        relay = RelayProcess(
            self.db_url,
            self.bootstrap,
            self.args,
            env={**self.env, **env},
            client=self.client,
            **same,
        )
        self.processes.append(relay.start())
        return relay

    def wait_all_published(self, rows: int) -> None:
        wait_for(
            lambda: row_states(self.db_url) == {"published": rows},
            timeout=120,
            what="the successor publishes everything",
        )

    def finished_exactly_once(
        self, victim: RelayProcess, topic: str, expected: list[tuple[str, bytes]], **env: str
    ) -> RelayProcess:
        """The successor publishes every row; a read_committed reader sees each once, in order."""
        successor = self.successor(victim, **env)
        self.wait_all_published(len(expected))
        received = consume(self.bootstrap, topic, expect=len(expected))
        assert_exactly_once_in_order(received, expected)
        return successor
