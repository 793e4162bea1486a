"""Handlers that raise what the consumer must still settle, without a database or Kafka: an
exception whose ``str()`` raises, and an ``asyncio.CancelledError`` of the handler's own (the
real-stack counterpart is tests/integration/test_inbox_unruly_handlers.py).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from outboxkit.errors import HandlerCancelledError, LeaseLostError
from outboxkit.inbox import Envelope, OutcomeKind
from outboxkit.inbox.batch import deliver_batch
from outboxkit.inbox.guard import error_text, message
from outboxkit.inbox.lease import LeaseHandle
from outboxkit.inbox.steps import (
    CallHandler,
    Publish,
    RunInSavepoint,
    RunInTransaction,
    Sql,
    StartLease,
    StartLeases,
    Step,
    drive_async,
    drive_sync,
    handler_cancelled,
)
from tests.unit.test_inbox_batch import _db as _batch_db
from tests.unit.test_inbox_batch import _env as _batch_env
from tests.unit.test_inbox_core import Script, _core, _db, _env

pytestmark = pytest.mark.unit

SECRET = "ssn-078-05-1120"


class Unprintable(Exception):
    """An application's exception whose ``__str__`` reads an attribute it never set."""

    def __str__(self) -> str:
        return str(self.detail)  # type: ignore[attr-defined]


class NotText(Exception):
    def __str__(self) -> Any:
        return 42


class Nameless(type):
    @property
    def __name__(cls) -> str:  # type: ignore[override]
        raise RuntimeError("no name")


class Anonymous(Exception, metaclass=Nameless):
    def __str__(self) -> str:
        raise RuntimeError("no text")


class RedefinedArgs(Unprintable):
    @property  # type: ignore[override]
    def args(self) -> Any:
        raise RuntimeError("no args")


class LooksLikeADatabaseError(Unprintable):
    sqlstate = "22P02"  # as a psycopg error says (its message may quote row values)


class LostLease(LeaseLostError):
    def __str__(self) -> str:
        raise AttributeError("reason")


@pytest.mark.parametrize("detail", [False, True])
def test_error_text_of_an_exception_whose_str_raises_names_its_class(detail: bool) -> None:
    assert error_text(Unprintable("card declined\nline two"), detail=detail) == (
        "Unprintable: card declined (str() raised AttributeError)"
    )
    assert error_text(Unprintable(), detail=detail) == "Unprintable (str() raised AttributeError)"
    assert error_text(Unprintable(b"raw"), detail=detail) == (
        "Unprintable (str() raised AttributeError)"
    )
    assert error_text(NotText("x"), detail=detail) == "NotText: x (str() raised TypeError)"
    assert error_text(RedefinedArgs("x"), detail=detail) == (
        "RedefinedArgs: x (str() raised AttributeError)"
    )
    assert error_text(Anonymous("x"), detail=detail) == "unprintable exception"


class ExitsWhenPrinted(Exception):
    """Its ``str()`` raises what is no ``Exception``: before, it escaped the settling and
    stopped the consumer, after every run of the event (a crash loop)."""

    def __str__(self) -> str:
        raise SystemExit(3)


def test_error_text_of_an_exception_whose_str_raises_a_base_exception() -> None:
    assert error_text(ExitsWhenPrinted("x")) == "ExitsWhenPrinted: x (str() raised SystemExit)"
    assert message(ExitsWhenPrinted("x")) == "ExitsWhenPrinted: x (str() raised SystemExit)"


class InterruptedWhilePrinted(Exception):
    def __str__(self) -> str:
        raise KeyboardInterrupt  # a Ctrl-C that lands while the text is made


def test_a_ctrl_c_while_the_error_text_is_made_is_not_swallowed() -> None:
    with pytest.raises(KeyboardInterrupt):
        error_text(InterruptedWhilePrinted("x"))
    with pytest.raises(KeyboardInterrupt):
        message(InterruptedWhilePrinted("x"))


def test_a_sync_handler_may_return_a_value_but_not_an_unrun_body() -> None:
    from outboxkit.errors import ConfigurationError
    from outboxkit.inbox.handler_session import returned_nothing

    returned_nothing(None)
    returned_nothing(["result", 1])  # ignored (a batch handler's results, say)

    async def coroutine() -> None:
        pass

    def generator() -> Any:
        yield 1

    for unrun in (coroutine(), generator()):
        with pytest.raises(ConfigurationError, match="coroutine or a generator"):
            returned_nothing(unrun)


def test_error_text_of_an_unprintable_database_error_quotes_no_value() -> None:
    text = error_text(LooksLikeADatabaseError(f"value {SECRET} refused"))
    assert text == "LooksLikeADatabaseError (str() raised AttributeError)"


def test_the_message_of_a_lost_lease_whose_str_raises_is_its_error_text() -> None:
    assert message(LeaseLostError("lease on event 'e1' lost: cancelled")) == (
        "lease on event 'e1' lost: cancelled"
    )
    assert message(LostLease("x")) == "LostLease: x (str() raised AttributeError)"


def _raising(error: BaseException, claim: tuple[int, int, str | None]) -> Any:
    answer = _db(claim, handler_fails=False)

    def raising(step: Step) -> Any:
        if isinstance(step, CallHandler):
            raise error
        return answer(step)

    return raising


def test_a_handler_exception_whose_str_raises_is_retried_then_dead_lettered() -> None:
    outcome = drive_sync(_core().deliver(_env()), Script(_raising(Unprintable("no"), (7, 1, None))))
    assert (outcome.kind, outcome.retry_in) == (OutcomeKind.RETRY, 0.5)
    assert outcome.error == "Unprintable: no (str() raised AttributeError)"

    letters: list[str] = []

    def dead_letter(env: Envelope, event_id: str, error: str, attempts: int) -> Step:
        letters.append(error)
        return Publish("orders.dlq", env.key, env.value, [])

    script = Script(_raising(Unprintable("no"), (7, 3, "earlier")))
    outcome = drive_sync(_core().deliver(_env(), dead_letter=dead_letter), script)
    assert outcome.kind is OutcomeKind.DEAD
    assert letters == ["Unprintable: no (str() raised AttributeError)"]
    assert "Publish" in script.names()


def test_a_handler_exception_whose_str_raises_fails_alone_in_a_batch() -> None:
    envs = [_batch_env("a", 0), _batch_env("x", 1, partition=1)]
    script = Script(_batch_db({"a": 1, "x": 1}, errors={"x": Unprintable("no")}))
    result = drive_sync(deliver_batch(_core(), envs, lambda tp: False, lambda *a: None), script)
    outcomes = {o.event_id: (o.kind, o.error) for _, o in result.outcomes}
    assert outcomes == {
        "a": (OutcomeKind.SUCCEEDED, None),
        "x": (OutcomeKind.RETRY, "Unprintable: no (str() raised AttributeError)"),
    }


# -- CancelledError ------------------------------------------------------------------------------
def test_a_cancelled_error_of_a_handler_step_is_its_failure_unless_the_task_is_cancelled() -> None:
    exc = asyncio.CancelledError()
    call = CallHandler(lambda *a: None, None, None)
    for step in (call, RunInTransaction(print, (), ()), RunInSavepoint(print, (), ())):
        failure = handler_cancelled(step, exc, 0)
        assert isinstance(failure, HandlerCancelledError)
        assert failure.__cause__ is exc
        assert str(failure) == "the handler raised CancelledError; the consumer was not cancelled"
        assert handler_cancelled(step, exc, 1) is None  # the consumer's own task: it stops
    assert handler_cancelled(StartLease("e1", 7), exc, 0) is None  # not the handler's


CANCELLED_TEXT = (
    "HandlerCancelledError: the handler raised CancelledError; the consumer was not cancelled"
)


def test_a_sync_handler_raising_cancelled_error_is_retried() -> None:
    script = Script(_raising(asyncio.CancelledError(), (7, 1, None)))
    outcome = drive_sync(_core().deliver(_env()), script)
    assert (outcome.kind, outcome.retry_in) == (OutcomeKind.RETRY, 0.5)
    assert outcome.error == CANCELLED_TEXT
    assert script.names()[-3:] == ["CloseHandler", "record_failure", "EndDelivery"]


def test_a_sync_batch_handler_raising_cancelled_error_fails_alone() -> None:
    envs = [_batch_env("a", 0), _batch_env("x", 1, partition=1)]
    errors: dict[str, Any] = {"x": asyncio.CancelledError()}
    script = Script(_batch_db({"a": 1, "x": 1}, errors=errors))
    result = drive_sync(deliver_batch(_core(), envs, lambda tp: False, lambda *a: None), script)
    kinds = {o.event_id: o.kind for _, o in result.outcomes}
    assert kinds == {"a": OutcomeKind.SUCCEEDED, "x": OutcomeKind.RETRY}


@pytest.mark.parametrize("stop", [KeyboardInterrupt, SystemExit])
def test_an_operators_stop_from_a_handler_still_propagates(stop: type[BaseException]) -> None:
    script = Script(_raising(stop(), (7, 1, None)))
    with pytest.raises(stop):
        drive_sync(_core().deliver(_env()), script)
    assert script.released == 1
    assert "record_failure" not in script.names()


def test_a_cancelled_error_outside_the_handler_still_propagates() -> None:
    answer = _db((7, 1, None), handler_fails=False)

    def cancelled_claim(step: Step) -> Any:
        if isinstance(step, Sql):
            raise asyncio.CancelledError
        return answer(step)

    with pytest.raises(asyncio.CancelledError):
        drive_sync(_core().deliver(_env()), Script(cancelled_claim))


def _async_script(handler: Any) -> Script:
    answer = _db((7, 1, None), handler_fails=False)

    async def step_of(step: Step) -> Any:
        if isinstance(step, CallHandler):
            return await handler()
        if isinstance(step, StartLease | StartLeases):
            return LeaseHandle("e1", 7, 0.0)
        return answer(step)

    return Script(step_of)


async def _await_a_cancelled_child() -> None:
    child = asyncio.create_task(asyncio.Event().wait())
    await asyncio.sleep(0)
    child.cancel()
    await child  # raises CancelledError here; this task itself was not cancelled


async def test_an_async_handler_awaiting_a_cancelled_child_task_is_retried() -> None:
    script = _async_script(_await_a_cancelled_child)
    outcome = await drive_async(_core().deliver(_env()), script)
    assert (outcome.kind, outcome.error) == (OutcomeKind.RETRY, CANCELLED_TEXT)
    assert "record_failure" in script.names()
    assert script.released == 0


async def test_cancelling_the_consumers_own_task_during_an_async_handler_still_stops_it() -> None:
    entered = asyncio.Event()

    async def handler() -> None:
        entered.set()
        await asyncio.Event().wait()

    script = _async_script(handler)
    task = asyncio.create_task(drive_async(_core().deliver(_env()), script))
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert script.released == 1  # the drive was ended, not the handler's failure recorded
    assert "record_failure" not in script.names()
