"""``outboxkit outbox parked|retry|discard`` on a real database (rows parked by hand here, as the
relay would after a permanent publish error)."""

from __future__ import annotations

import json
from urllib.parse import urlsplit, urlunsplit

import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from outboxkit.cli import main
from outboxkit.events import Message
from outboxkit.outbox import Outbox
from outboxkit.testing import outboxed

_OUTBOX = Outbox()  # the default configuration (schema "outboxkit")
add_many = _OUTBOX.add_many

pytestmark = pytest.mark.integration


def _park(sa_url: str, count: int) -> list[int]:
    engine = sa.create_engine(sa_url)
    try:
        with engine.begin() as conn:
            results = add_many(conn, [Message("t", b"x", key=f"k{i}") for i in range(count)])
            ids = [r.id for r in results if r.id is not None]
            conn.execute(
                sa.text(
                    "UPDATE outboxkit.outbox_message SET state = 'parked',"
                    " parked_reason = 'too large', parked_at = now() WHERE id = ANY(:ids)"
                ),
                {"ids": ids},
            )
        return ids
    finally:
        engine.dispose()


def _states(sa_url: str) -> dict[int, str]:
    engine = sa.create_engine(sa_url)
    try:
        with engine.connect() as conn:
            return {m.id: m.state for m in outboxed(conn)}
    finally:
        engine.dispose()


def test_list_retry_and_discard_parked_rows(outboxkit_db_url: str, sa_url: str) -> None:
    ids = _park(sa_url, 4)
    runner = CliRunner()
    env = {"OUTBOXKIT_DATABASE_URL": outboxkit_db_url}

    listed = runner.invoke(main, ["outbox", "parked", "--json"], env=env)
    assert listed.exit_code == 0, listed.output
    items = json.loads(listed.output)
    assert [i["id"] for i in items] == ids
    assert {i["reason"] for i in items} == {"too large"}

    retried = runner.invoke(main, ["outbox", "retry", str(ids[0]), str(ids[1])], env=env)
    assert retried.exit_code == 0, retried.output
    assert f"2 row(s) back to pending: {ids[:2]}" in retried.output
    discarded = runner.invoke(main, ["outbox", "discard", "--all"], env=env)
    assert discarded.exit_code == 0, discarded.output
    assert f"2 row(s) discarded: {ids[2:]}" in discarded.output
    expected = ["pending", "pending", "discarded", "discarded"]
    assert _states(sa_url) == dict(zip(ids, expected, strict=True))

    nothing = runner.invoke(main, ["outbox", "retry"], env=env)
    assert nothing.exit_code != 0
    assert "name row ids, or --all" in nothing.output


def test_a_bad_password_is_one_line_without_the_password(outboxkit_db_url: str) -> None:
    parts = urlsplit(outboxkit_db_url)
    wrong = "Wr0ngCliSecret"
    url = urlunsplit(
        parts._replace(netloc=f"{parts.username}:{wrong}@{parts.hostname}:{parts.port}")
    )
    done = CliRunner().invoke(main, ["outbox", "parked"], env={"OUTBOXKIT_DATABASE_URL": url})
    assert done.exit_code == 1
    assert "password authentication failed" in done.output
    assert wrong not in done.output
    assert "Traceback" not in done.output


def _unreachable(url: str) -> str:
    """The same database on a port nothing listens on."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=f"{parts.hostname}:1"))


def test_database_options_go_before_or_after_the_subcommand(
    outboxkit_db_url: str, sa_url: str
) -> None:
    """As ``migrate`` and ``inbox`` take them after their subcommands, ``outbox`` does too; one
    given after wins over one given before (the group's is then not used)."""
    ids = _park(sa_url, 2)
    runner = CliRunner(env={"OUTBOXKIT_DATABASE_URL": None})
    bad = _unreachable(outboxkit_db_url)
    for args in (
        ["outbox", "parked", "--json", "--database-url", outboxkit_db_url],
        ["outbox", "--database-url", outboxkit_db_url, "parked", "--json"],
        ["outbox", "--database-url", bad, "parked", "--json", "--database-url", outboxkit_db_url],
    ):
        listed = runner.invoke(main, args)
        assert listed.exit_code == 0, (args, listed.output)
        assert [i["id"] for i in json.loads(listed.output)] == ids
    retried = runner.invoke(main, ["outbox", "retry", "--all", "--database-url", outboxkit_db_url])
    assert retried.exit_code == 0, retried.output
    assert f"2 row(s) back to pending: {ids}" in retried.output
    refused = runner.invoke(main, ["outbox", "discard", str(ids[0]), "--database-url", bad])
    assert refused.exit_code == 1, refused.output


def test_a_long_retry_lists_its_first_ids_and_the_count(outboxkit_db_url: str, sa_url: str) -> None:
    """``--all`` over 100,000 rows printed every id, 689 KB on one line."""
    ids = _park(sa_url, 25)
    env = {"OUTBOXKIT_DATABASE_URL": outboxkit_db_url}
    retried = CliRunner().invoke(main, ["outbox", "retry", "--all"], env=env)
    assert retried.exit_code == 0, retried.output
    shown = ", ".join(str(i) for i in ids[:20])
    assert retried.output == f"25 row(s) back to pending: [{shown}, ...] (the first 20 shown)\n"
    assert set(_states(sa_url).values()) == {"pending"}
