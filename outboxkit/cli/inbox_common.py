"""What the ``outboxkit inbox`` commands share: the engine, the ``--json`` flag, the consumer
name check, and text made safe to print."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError

from outboxkit.cli.options import resolve_or_exit
from outboxkit.db import redact
from outboxkit.db.engines import sync_engine
from outboxkit.inbox.guard import escape
from outboxkit.schema import name_problem

json_option = click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")


@contextmanager
def engine_for(
    config_path: str | None, database_url: str | None, schema: str | None
) -> Iterator[tuple[Engine, str]]:
    """The engine and schema the settings name (options win). A database error ends the command
    in one line: no traceback, no parameters, no password."""
    target = resolve_or_exit(config_path, database_url, schema)
    url = target.require_url()
    engine = sync_engine(url, connect_args=target.connect_options)
    try:
        yield engine, target.schema
    except DBAPIError as exc:
        text = redact(f"{type(exc.orig).__name__}: {str(exc.orig).strip()}", url)
        raise click.ClickException(text) from None
    finally:
        engine.dispose()


def jsonable(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return value.isoformat()
    return value


def printable(value: Any) -> str:
    """Stored text comes from producers: control characters and escape sequences are shown
    escaped (``\x1b``), never sent to the terminal."""
    return escape(str(value))


def consumer_name(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A name no consumer can have (settings refuse it: :func:`~outboxkit.schema.name_problem`)
    finds nothing, and ``cancel --before-delivery`` would store a row for it."""
    problem = None if value is None else name_problem(value)
    if problem is not None:
        raise click.BadParameter(f"a consumer name that {problem}: no consumer can have it")
    return value
