"""``outbox retry|discard ID ...`` names the ids that changed nothing (no such row, or not
parked) and exits 1 when none of them did: "0 row(s)" with exit 0 read as done."""

from __future__ import annotations

import psycopg
import pytest
from click.testing import CliRunner

from outboxkit.cli import main
from tests.relay_support import insert_rows

pytestmark = pytest.mark.integration


def _parked(url: str, count: int) -> list[int]:
    ids = insert_rows(url, "t", [(f"k{i}", b"{}") for i in range(count)])
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "UPDATE outboxkit.outbox_message SET state = 'parked', parked_reason = 'r',"
            " parked_at = now() WHERE id = ANY(%s)",
            (ids,),
        )
    return ids


@pytest.mark.parametrize(
    ("action", "said"), [("retry", "back to pending"), ("discard", "discarded")]
)
def test_ids_that_changed_nothing_are_named(outboxkit_db_url: str, action: str, said: str) -> None:
    [parked] = _parked(outboxkit_db_url, 1)
    [pending] = insert_rows(outboxkit_db_url, "t", [("k", b"{}")])
    missing = [10**9 + i for i in range(12)]
    env = {"OUTBOXKIT_DATABASE_URL": outboxkit_db_url}

    none = CliRunner().invoke(main, ["outbox", action, str(pending), str(missing[0])], env=env)
    assert none.exit_code == 1, none.output
    assert none.stdout == f"0 row(s) {said}: []\n"
    assert none.stderr == (
        f"2 id(s) not changed (no such row, or not parked): {pending}, {missing[0]}\n"
    )

    some = CliRunner().invoke(main, ["outbox", action, str(parked), *map(str, missing)], env=env)
    assert some.exit_code == 0, some.output
    assert some.stdout == f"1 row(s) {said}: [{parked}]\n"  # as before
    shown = ", ".join(map(str, missing[:10]))
    assert some.stderr == (
        f"12 id(s) not changed (no such row, or not parked): {shown} (the first 10 shown)\n"
    )
