"""``migrate grants`` refuses a role name GRANT reads as something else than one role: a quoted
"public" is still PUBLIC there, and the relay's rights would go to every role."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from outboxkit import db
from outboxkit.cli import main

pytestmark = pytest.mark.integration

PUBLIC_GRANTS = (
    "SELECT count(*) FROM pg_class c, aclexplode(c.relacl) a"
    " WHERE c.relnamespace = 'outboxkit'::regnamespace AND a.grantee = 0"
)


@pytest.mark.parametrize("kind", ["app", "relay", "consumer"])
def test_public_is_refused_before_anything_is_granted(kind: str, outboxkit_db_url: str) -> None:
    with db.connect(outboxkit_db_url) as conn:
        before = conn.execute(PUBLIC_GRANTS).fetchone()
    for apply in (["--apply"], []):
        result = CliRunner().invoke(
            main, ["migrate", "grants", f"--{kind}", "public", *apply],
            env={"OUTBOXKIT_DATABASE_URL": outboxkit_db_url},
        )  # fmt: skip
        assert result.exit_code == 2, result.output
        assert "PUBLIC" in result.output
        assert "BEGIN;" not in result.output  # no script either
    with db.connect(outboxkit_db_url) as conn:
        assert conn.execute(PUBLIC_GRANTS).fetchone() == before
