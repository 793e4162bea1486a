"""The docs stand alone: no file outside the repository, no issue-tracker leftovers, no claim
that the relay writes a back-off it keeps in memory. And what they name exists: every
``OUTBOXKIT_*`` variable, setting, metric, command, option and relative link."""

from __future__ import annotations

import functools
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


# --- names the docs mention must exist --------------------------------------------------------

DOC_TEXTS = {path: path.read_text() for path in DOCS}


@functools.cache
def _setting_variables() -> set[str]:
    """Every ``OUTBOXKIT_*`` variable the settings model reads, plus the variables and prefixes
    the code itself names (fault points, the dev stack, cache directory)."""
    from outboxkit.settings import models

    names = {models.CONFIG_ENV, models.SECRETS_DIR_ENV, models.SCHEMA_ENV}
    for part in (
        models.DatabaseSettings,
        models.KafkaSettings,
        models.RelaySettings,
        models.ConsumerSettings,
    ):
        prefix = str(part.model_config.get("env_prefix", ""))
        names.add(prefix.rstrip("_"))
        names.update(prefix + field.upper() for field in part.model_fields)
    for folder in ("outboxkit", "scripts", "benchmarks"):
        for source in ROOT.joinpath(folder).rglob("*"):
            if source.suffix in (".py", ".sh") and source.is_file():
                names.update(re.findall(r"OUTBOXKIT_[A-Z0-9_]*[A-Z0-9]", source.read_text()))
    names.update(re.findall(r"OUTBOXKIT_[A-Z0-9_]*[A-Z0-9]", (ROOT / "Makefile").read_text()))
    return names


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_outboxkit_variable_exists(path: Path) -> None:
    known = _setting_variables()
    for found in re.finditer(r"OUTBOXKIT_[A-Z0-9_]*[A-Z0-9]", DOC_TEXTS[path]):
        name = found[0]
        if name in known:
            continue
        # "OUTBOXKIT_KAFKA_*" / "OUTBOXKIT_KAFKA_<NAME>": a prefix of real names
        follows = DOC_TEXTS[path][found.end() : found.end() + 2]
        is_prefix = follows[:2] in ("_*", "_<") and any(k.startswith(name + "_") for k in known)
        assert is_prefix, f"{path.name}: {name} is not a setting or a variable the code reads"


@functools.cache
def _metric_names() -> set[str]:
    names: set[str] = set()
    for module in ("relay/metrics.py", "inbox/metrics.py"):
        names.update(
            re.findall(r'"(outboxkit_[a-z_]+)"', (ROOT / "outboxkit" / module).read_text())
        )
    return names


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_metric_exists(path: Path) -> None:
    known = _metric_names()
    assert "outboxkit_relay_backlog" in known
    assert "outboxkit_inbox_outcomes" in known
    for name in re.findall(r"\boutboxkit_(?:relay|inbox)_[a-z_]+", DOC_TEXTS[path]):
        base = re.sub(r"_(total|bucket|sum|count|created)$", "", name)
        assert base in known, f"{path.name}: metric {name} does not exist"


def _code(text: str) -> list[str]:
    """Lines of fenced code blocks and inline code spans."""
    blocks = re.findall(r"```[^\n]*\n(.*?)```", text, flags=re.DOTALL)
    prose = re.sub(r"```.*?```", "", text, flags=re.DOTALL)
    return [line for block in blocks for line in block.splitlines()] + re.findall(
        r"`([^`\n]+)`", prose
    )


def _commands() -> list[tuple[list[str], set[str]]]:
    """Each ``outboxkit ...`` invocation in the docs' code: (command path, --options used)."""
    found = []
    for text in DOC_TEXTS.values():
        for line in _code(text):
            line = line.split("#")[0]  # a comment is prose
            if re.search(r"\b(from|import) outboxkit\b", line):
                continue  # Python, not the command line
            for match in re.finditer(r"(?:^|[\s(])outboxkit ((?:[a-z][a-z-]* ?)+.*)", line):
                rest = re.split(r"#| \| |&&|;|\$\(", match[1])[0]
                words = rest.split()
                if words and words[0].endswith(":"):
                    continue  # program output ("outboxkit verify: seed ..."), not a command
                path = [w for w in words if re.fullmatch(r"[a-z][a-z-]*", w)]
                options = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", rest))
                found.append((path, options))
    return found


def test_every_documented_command_and_option_exists() -> None:
    import click

    from outboxkit.cli import main

    checked = 0
    for words, options in _commands():
        command: click.Command = main
        ctx = click.Context(main)
        known: set[str] = set()
        for word in words:
            if not isinstance(command, click.Group):
                break
            sub = command.get_command(ctx, word)
            assert sub is not None, f"`outboxkit {' '.join(words)}`: no command {word!r}"
            command, ctx = sub, click.Context(sub, parent=ctx)
            for param in command.params:
                known.update(getattr(param, "opts", []))
                known.update(getattr(param, "secondary_opts", []))
        known.add("--help")
        missing = options - known
        assert not missing, f"`outboxkit {' '.join(words)}`: no option {sorted(missing)}"
        checked += 1
    assert checked > 30


def _anchors(text: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    headings = re.findall(r"^#+ (.+)$", re.sub(r"```.*?```", "", text, flags=re.DOTALL), re.M)
    return {re.sub(r"[^a-z0-9 _-]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def test_relative_links_and_anchors_resolve() -> None:
    checked = 0
    for path, text in DOC_TEXTS.items():
        for target, anchor in re.findall(r"\]\(([^)#\s]*)(?:#([^)\s]*))?\)", text):
            if re.match(r"[a-z]+:", target):
                continue
            resolved = (path.parent / target).resolve() if target else path
            assert resolved.exists(), f"{path.name}: {target}"
            if anchor and resolved.suffix == ".md":
                assert anchor in _anchors(resolved.read_text()), f"{path.name}: {target}#{anchor}"
                checked += 1
    assert checked > 10


@functools.cache
def _setting_fields() -> set[str]:
    from outboxkit.settings import models

    fields = {"schema"}  # the top-level TOML key of the schema name
    for part in (
        models.DatabaseSettings,
        models.KafkaSettings,
        models.RelaySettings,
        models.ConsumerSettings,
    ):
        fields.update(part.model_fields)
    return fields


def _settings_in_tables(text: str) -> list[str]:
    """Names in the first column of every table whose header's first cell says "setting"."""
    names: list[str] = []
    header: str | None = None  # the first cell of the current table's header row
    for line in text.splitlines():
        if not line.startswith("|"):
            header = None
            continue
        first = line.split("|")[1]
        if header is None:
            header = first
            continue
        if "setting" not in header.lower():
            continue
        for span in re.findall(r"`([^`]+)`", first):
            span = re.sub(r"\[[^\]]*\]", "", span).strip()
            names += re.findall(r"^[a-z][a-z0-9_]*$", span)
    return names


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_settings_tables_name_real_settings(path: Path) -> None:
    fields = _setting_fields()
    for name in _settings_in_tables(DOC_TEXTS[path]):
        assert name in fields, f"{path.name}: setting {name!r} is not in the settings model"


def test_settings_tables_are_found() -> None:
    assert len(_settings_in_tables(ROOT.joinpath("docs/tuning.md").read_text())) > 30
