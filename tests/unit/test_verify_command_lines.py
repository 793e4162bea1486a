"""``outboxkit verify`` starts its children with no secret on their command lines: any local user
reads a process's command line (``ps``, ``/proc/<pid>/cmdline``) for as long as it runs."""

from __future__ import annotations

from pathlib import Path

from outboxkit.settings import KafkaSettings
from outboxkit.verify.layout import RunConfig, Target
from outboxkit.verify.run import Run
from outboxkit.verify.target import DATABASE_ENV

URL = "postgresql://app:S3CRET-pw@127.0.0.1:1/db"


def test_no_child_gets_the_database_url_as_an_argument(tmp_path: Path) -> None:
    target = Target(URL, KafkaSettings.plaintext("127.0.0.1:1"), {DATABASE_ENV: URL})
    run = Run(RunConfig(seed=1, duration=1.0, workdir=tmp_path), target, print)
    children = [run._writer(0), run._relay(0), run._consumer(0), run._consumer(1)]
    for child in children:
        assert not any("S3CRET" in arg for arg in child.argv), child.name
        assert "S3CRET" in child.env[DATABASE_ENV]  # it goes in the environment instead
