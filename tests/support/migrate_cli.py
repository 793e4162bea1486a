"""`outboxkit migrate up` in processes of their own, as two deployments would run it at once."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

CLI = str(Path(sys.executable).parent / "outboxkit")


def migrate_up_processes(url: str, count: int) -> list[subprocess.Popen[str]]:
    """``count`` processes started at once against ``url``; the caller waits for them."""
    # Only the URL: a stray OUTBOXKIT_* in the shell (a schema, say) would change what runs.
    environ = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOXKIT_")}
    environ["OUTBOXKIT_DATABASE_URL"] = url
    return [
        subprocess.Popen(
            [CLI, "migrate", "up"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=environ,
        )
        for _ in range(count)
    ]
