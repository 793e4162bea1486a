"""``outboxkit outbox parked|retry|discard``: see and act on parked rows.

``--config``, ``--database-url`` and ``--schema`` go before the subcommand or after it (as
``migrate``'s and ``inbox``'s go after theirs); one given after wins.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import click
import psycopg

from outboxkit import db
from outboxkit.cli.options import LIMIT_MAX, database_options, resolve_or_exit
from outboxkit.inbox.guard import escape
from outboxkit.schema import parked_lock_name


@click.group()
@database_options
@click.pass_context
def outbox(
    ctx: click.Context, config_path: str | None, database_url: str | None, schema: str | None
) -> None:
    """Operate on outbox rows (parked rows: list, retry, discard)."""
    ctx.obj = {"config_path": config_path, "url": database_url, "schema": schema}


Where = dict[str, str | None]
F = TypeVar("F", bound=Callable[..., Any])


def _where(
    group: Where, config_path: str | None, database_url: str | None, schema: str | None
) -> Where:
    """The group's database options, overridden by those the subcommand was given."""
    given = {"config_path": config_path, "url": database_url, "schema": schema}
    return {
        name: given[name] if given[name] is not None else value for name, value in group.items()
    }


def _rows(
    obj: Where, name: str, params: dict[str, Any], *, releasing: bool = False
) -> Sequence[tuple[Any, ...]]:
    """One statement on a connection of our own; a database error is one line, password-free.
    ``releasing``: a change of parked rows, in a transaction with what it owes held rows
    (migration 0009): parked_lock first, held_release after. The settings are read here, not in
    the group: ``outbox parked --help`` needs none."""
    target = resolve_or_exit(obj["config_path"], obj["url"], obj["schema"])
    url = target.require_url()
    query = db.query("relay", name, target.schema)
    try:
        with db.connect(url) as conn, conn.transaction():
            if releasing:
                params = {**params, "shards": _lock_parked_shards(conn, target.schema, params)}
            found = db.rows(conn, query, params)
            if releasing:
                held = db.query("relay", "held_release", target.schema)
                db.rows(conn, held, {"shards": params["shards"]})
            return found
    except psycopg.Error as exc:
        raise click.ClickException(str(exc).strip()) from None


def _lock_parked_shards(conn: Any, schema: str, params: dict[str, Any]) -> list[int]:
    """parked_lock of each shard whose parked rows the command changes, in ascending order (a
    hold pass of one of them meanwhile ends first; one starting later waits), each waited for
    5 s at most; the shards."""
    db.rows(conn, db.query("relay", "shards_lock_timeout", schema))
    shards = [int(r[0]) for r in db.rows(conn, db.query("relay", "parked_shards", schema), params)]
    lock, name = db.query("relay", "parked_lock", schema), parked_lock_name(schema)
    for shard in shards:
        db.rows(conn, lock, {"name": name, "shard": shard})
    return shards


@outbox.command()
@click.option("--limit", default=100, show_default=True, type=click.IntRange(0, LIMIT_MAX))
@click.option("--json", "as_json", is_flag=True)
@database_options
@click.pass_obj
def parked(
    group: Where,
    limit: int,
    as_json: bool,
    config_path: str | None,
    database_url: str | None,
    schema: str | None,
) -> None:
    """List parked rows with their reason."""
    obj = _where(group, config_path, database_url, schema)
    rows = _rows(obj, "parked_list", {"limit": limit})
    total = int(rows[0][8]) if rows else 0
    items = [
        {
            "id": r[0],
            "event_id": str(r[1]),
            "topic": r[2],
            "key": r[3],
            "shard": r[4],
            "attempts": r[5],
            "reason": r[6],
            "parked_at": r[7].isoformat() if r[7] else None,
        }
        for r in rows
        if r[0] is not None
    ]
    summary = f"{total} parked row(s)"
    if total > len(items):
        summary += f", the first {len(items)} shown (--limit)"
    if as_json:
        click.echo(json.dumps(items))
        if total > len(items):  # the list stays the list: the rest is said on stderr
            click.echo(summary, err=True)
        return
    for item in items:
        # Keys and reasons come from producers: a newline would fake a row, an escape sequence
        # drive the operator's terminal. Shown escaped, as `inbox show` does.
        topic, key, reason = (escape(str(item[c])) for c in ("topic", "key", "reason"))
        click.echo(f"{item['id']}\t{topic}\tkey={key}\tshard={item['shard']}\t{reason}")
    click.echo(summary)


_UNCHANGED_SHOWN = 10
# The ids a retry or discard lists: `--all` over 100,000 rows printed 689 KB on one line.
_DONE_SHOWN = 20


def _done(count_text: str, done: list[int]) -> str:
    if len(done) <= _DONE_SHOWN:
        return f"{len(done)} row(s) {count_text}: {done}"
    shown = ", ".join(str(i) for i in done[:_DONE_SHOWN])
    return f"{len(done)} row(s) {count_text}: [{shown}, ...] (the first {_DONE_SHOWN} shown)"


def _act(obj: Where, name: str, ids: tuple[int, ...], all_rows: bool) -> list[int]:
    if not ids and not all_rows:
        raise click.UsageError("name row ids, or --all")
    rows = _rows(obj, name, {"ids": list(ids), "all": all_rows}, releasing=True)
    return sorted(int(r[0]) for r in rows)  # the statement returns them in no order


def _unchanged(ids: tuple[int, ...], all_rows: bool, done: list[int]) -> None:
    """The ids given that named no parked row (a typo, or a row another operator handled), on
    stderr, a few of them; exit 1 when none was changed: "0 row(s)" and exit 0 read as done."""
    if all_rows:
        return
    changed = set(done)
    missed = [i for i in dict.fromkeys(ids) if i not in changed]
    if not missed:
        return
    shown = ", ".join(str(i) for i in missed[:_UNCHANGED_SHOWN])
    more = f" (the first {_UNCHANGED_SHOWN} shown)" if len(missed) > _UNCHANGED_SHOWN else ""
    click.echo(
        f"{len(missed)} id(s) not changed (no such row, or not parked): {shown}{more}", err=True
    )
    if not done:
        click.get_current_context().exit(1)


def _action(function: F) -> F:
    """The arguments and options of ``retry`` and ``discard`` (each passes the group's object)."""
    ids = click.argument("ids", nargs=-1, type=int)
    every = click.option("--all", "all_rows", is_flag=True, help="Every parked row.")
    return ids(every(database_options(function)))


def _act_and_report(
    group: Where,
    given: dict[str, str | None],
    name: str,
    said: str,
    ids: tuple[int, ...],
    all_rows: bool,
) -> None:
    obj = _where(group, given["config_path"], given["database_url"], given["schema"])
    done = _act(obj, name, ids, all_rows)
    click.echo(_done(said, done))
    _unchanged(ids, all_rows, done)


@outbox.command()
@_action
@click.pass_obj
def retry(group: Where, /, ids: tuple[int, ...], all_rows: bool, **given: str | None) -> None:
    """Give parked rows back to the relay (same-key rows behind them follow in order)."""
    _act_and_report(group, given, "parked_retry", "back to pending", ids, all_rows)


@outbox.command()
@_action
@click.pass_obj
def discard(group: Where, /, ids: tuple[int, ...], all_rows: bool, **given: str | None) -> None:
    """Give up on parked rows for good (same-key rows behind them flow again)."""
    _act_and_report(group, given, "parked_discard", "discarded", ids, all_rows)
