"""Files the dev stack writes: secrets that are never readable by others, and directories it owns.

Secrets (a password file, a state file holding URLs with passwords) are created with mode 0600
from the first byte: writing first and ``chmod``-ing after leaves a window in which any local user
can read them. Directories the stack creates carry a marker with a random token, so the orphan
reaper can prove a directory named in its registry is one it made before deleting it.
"""

from __future__ import annotations

import contextlib
import hmac
import os
import secrets
import stat
import tempfile
from pathlib import Path

from outboxkit.errors import ConfigurationError

OWNED_PREFIX = "outboxkit-"
MARKER_NAME = ".outboxkit-devstack"


def cache_dir() -> Path:
    """Where fetched artefacts (Kafka jars), the service registry and state files live.

    One that cannot be made or written (``XDG_CACHE_HOME`` a file, a read-only home) is a
    one-line error naming it and the way out, not a traceback from deep in the stack."""
    root = os.environ.get("OUTBOXKIT_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "outboxkit"
    )
    path = Path(root)
    problem = None
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        problem = exc.strerror or str(exc)
    if problem is None and not os.access(path, os.W_OK | os.X_OK):
        problem = "not writable"
    if problem is not None:
        raise ConfigurationError(
            f"the dev stack's cache directory {path} cannot be used ({problem});"
            " set OUTBOXKIT_CACHE_DIR to a writable directory"
        )
    return path


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` (mode 0600), atomically replacing any previous file.

    The temporary file is created with ``O_EXCL|O_NOFOLLOW`` so a planted file or symlink is
    never written through, and readers never see a half-written file.
    """
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(tmp, flags | getattr(os, "O_CLOEXEC", 0), 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def make_owned_dir(prefix: str) -> tuple[Path, str]:
    """A fresh private temp directory named ``outboxkit-…`` holding a marker; returns its token."""
    if not prefix.startswith(OWNED_PREFIX):
        raise ValueError(f"owned directories are named {OWNED_PREFIX}*, not {prefix!r}")
    path = Path(tempfile.mkdtemp(prefix=prefix))
    token = secrets.token_hex(16)
    write_private(path / MARKER_NAME, token)
    return path, token


def is_own_dir(path: str | Path, token: str) -> bool:
    """True only for a real directory directly in the temp dir, named ``outboxkit-…``, whose
    marker file holds ``token``. Anything else (a symlink, ``/``, a home directory, a directory
    another tool made) is not ours, whatever the registry says."""
    if not token:
        return False
    candidate = Path(path)
    if not candidate.is_absolute() or not candidate.name.startswith(OWNED_PREFIX):
        return False
    try:
        info = candidate.lstat()
        if not stat.S_ISDIR(info.st_mode):
            return False
        if Path(os.path.realpath(candidate)).parent != Path(
            os.path.realpath(tempfile.gettempdir())
        ):
            return False
        marker = candidate / MARKER_NAME
        if not stat.S_ISREG(marker.lstat().st_mode):
            return False
        found = marker.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return False
    return hmac.compare_digest(found.encode(), token.encode())
