"""The handler connection's guard remembers its verdict per statement text: the same text is
judged alike with and without parameters (a ';' then COMMIT counts only without), a text that
is only equal to another (a str subclass) is judged on its own, and the memory stays bounded."""

from __future__ import annotations

import pytest

from outboxkit.errors import HandlerCommitError
from outboxkit.inbox import commit_guard
from outboxkit.inbox.commit_guard import _refuse


@pytest.fixture(autouse=True)
def _fresh_verdicts() -> None:
    for verdicts in commit_guard._VERDICTS:
        verdicts.clear()


@pytest.mark.parametrize("first_with_params", [True, False])
def test_a_later_commit_counts_only_without_parameters_in_either_order(
    first_with_params: bool,
) -> None:
    text = "SELECT 1; COMMIT"
    for with_params in (first_with_params, not first_with_params) * 2:
        if with_params:
            _refuse(text, {"n": 1}, None)
        else:
            with pytest.raises(HandlerCommitError):
                _refuse(text, None, None)


def test_bytes_and_str_are_refused_every_time() -> None:
    for _ in range(3):
        with pytest.raises(HandlerCommitError):
            _refuse("COMMIT", None, None)
        with pytest.raises(HandlerCommitError):
            _refuse(b"ROLLBACK", {"x": 1}, None)
        _refuse("INSERT INTO t VALUES (1)", {"x": 1}, None)


class _PosingAsSelect(str):
    """Hashes and compares like the harmless text remembered first."""

    def __hash__(self) -> int:
        return hash("SELECT 1")

    def __eq__(self, other: object) -> bool:
        return True


def test_a_str_subclass_is_judged_on_its_own_text() -> None:
    _refuse("SELECT 1", None, None)  # remembered as harmless
    with pytest.raises(HandlerCommitError):
        _refuse(_PosingAsSelect("COMMIT"), None, None)


def test_the_memory_is_bounded() -> None:
    for n in range(commit_guard._VERDICTS_MAX * 3):
        _refuse(f"SELECT {n}", None, None)
    assert 0 < len(commit_guard._VERDICTS[1]) <= commit_guard._VERDICTS_MAX
    with pytest.raises(HandlerCommitError):
        _refuse("END", None, None)
