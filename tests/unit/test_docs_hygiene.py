"""The docs stand alone: no file outside the repository, no issue-tracker leftovers, and no
claim that the relay writes a back-off it keeps in memory."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted([*ROOT.joinpath("docs").glob("*.md"), ROOT / "README.md", ROOT / "relay/RUNBOOK.md"])
FORBIDDEN = [
    re.compile(r"CONTRACT\.md"),
    re.compile(r"\(issue[:\s]", re.IGNORECASE),
    re.compile(r"/work/"),
    re.compile(r"next_attempt_at\s*=\s*now\(\)"),
    re.compile(r"claim\s*(->|→)\s*mark", re.IGNORECASE),
]


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_leftovers(path: Path) -> None:
    text = path.read_text()
    for pattern in FORBIDDEN:
        found = pattern.search(text)
        assert found is None, f"{path.name}: {found[0] if found else ''!r}"
