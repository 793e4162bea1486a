"""Kafka Connect worker and connector configuration: templates in this folder, filled at run time.

The templates are Java ``.properties`` files with ``{{name}}`` placeholders (double braces, so
Debezium's own ``${routedByValue}`` passes through untouched). Rendering refuses a placeholder
left unfilled or a value given for a placeholder that does not exist, so a typo cannot silently
produce a half-configured connector.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORKER_TEMPLATE = HERE / "connect-standalone.properties"
DISTRIBUTED_WORKER_TEMPLATE = HERE / "connect-distributed.properties"
CONNECTOR_TEMPLATE = HERE / "outbox-connector.properties"
LOG4J2_CONFIG = HERE / "connect-log4j2.properties"

_PLACEHOLDER = re.compile(r"\{\{([a-z_]+)\}\}")
# Debezium's default poll wait; the benchmark also measures a low-latency setting.
DEFAULT_POLL_INTERVAL_MS = 500
# Added to the connector for the exactly-once run (on the distributed worker): the worker refuses
# the connector unless it can honour it; one transaction per batch the task returns from a poll.
EXACTLY_ONCE_SETTINGS = {"exactly.once.support": "required", "transaction.boundary": "poll"}


class TemplateError(ValueError):
    """A template could not be rendered or parsed."""


def placeholders(text: str) -> set[str]:
    return set(_PLACEHOLDER.findall(text))


def render(text: str, values: Mapping[str, object]) -> str:
    """Fill every ``{{name}}``; unknown or missing names are errors."""
    wanted = placeholders(text)
    missing = wanted - values.keys()
    extra = values.keys() - wanted
    if missing or extra:
        raise TemplateError(f"placeholders missing {sorted(missing)}, unknown {sorted(extra)}")
    return _PLACEHOLDER.sub(lambda m: str(values[m.group(1)]), text)


def parse_properties(text: str) -> dict[str, str]:
    """The subset of Java ``.properties`` the templates use: ``key=value`` lines and comments.

    Continuation lines and escapes are refused rather than half-understood.
    """
    out: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        key, sep, value = line.partition("=")
        if not sep or not key.strip():
            raise TemplateError(f"line {number}: expected key=value: {raw!r}")
        if value.endswith("\\") or "\\" in key:
            raise TemplateError(f"line {number}: escapes and continuations are not supported")
        key = key.strip()
        if key in out:
            raise TemplateError(f"line {number}: duplicate key {key}")
        out[key] = value.strip()
    return out


def worker_properties(
    *, bootstrap: str, rest_port: int, plugin_path: Path, offsets_file: Path
) -> str:
    """The standalone worker's properties file, ready to write."""
    return render(
        WORKER_TEMPLATE.read_text(),
        {
            "bootstrap": bootstrap,
            "rest_port": rest_port,
            "plugin_path": plugin_path,
            "offsets_file": offsets_file,
        },
    )


def distributed_worker_properties(
    *, bootstrap: str, rest_port: int, plugin_path: Path, group: str
) -> str:
    """The distributed worker's properties file (exactly-once source support), ready to write."""
    return render(
        DISTRIBUTED_WORKER_TEMPLATE.read_text(),
        {
            "bootstrap": bootstrap,
            "rest_port": rest_port,
            "plugin_path": plugin_path,
            "group": group,
        },
    )


def connector_config(
    *,
    name: str,
    db_port: int,
    db_user: str,
    db_password: str,
    db_name: str,
    slot: str,
    publication: str,
    poll_interval_ms: int = DEFAULT_POLL_INTERVAL_MS,
    exactly_once: bool = False,
) -> dict[str, str]:
    """The connector's configuration as the REST API takes it (a flat string map)."""
    text = render(
        CONNECTOR_TEMPLATE.read_text(),
        {
            "name": name,
            "db_port": db_port,
            "db_user": db_user,
            "db_password": db_password,
            "db_name": db_name,
            "slot": slot,
            "publication": publication,
            "poll_interval_ms": poll_interval_ms,
        },
    )
    config = parse_properties(text)
    if exactly_once:
        config |= EXACTLY_ONCE_SETTINGS
    return config


def router_columns(config: Mapping[str, str], transform: str = "outbox") -> dict[str, str]:
    """The outbox table columns the EventRouter reads, by role (for checking them)."""
    prefix = f"transforms.{transform}."
    columns = {
        key.removeprefix(prefix): value
        for key, value in config.items()
        if key.startswith(prefix + "table.field.event.") or key == prefix + "route.by.field"
    }
    placement = config.get(prefix + "table.fields.additional.placement", "")
    for entry in filter(None, (part.strip() for part in placement.split(","))):
        column, _, rest = entry.partition(":")
        columns[f"additional.{rest}"] = column
    return columns
