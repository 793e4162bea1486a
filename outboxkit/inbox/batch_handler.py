"""Batch handlers (sans-IO): one call with the events of a batch, for bulk effects.

A function registered with ``@registry.batch_handler(Model)`` is called as
``handler(events, ctx, session)`` with a :class:`BatchContext`. In a batch (see
:mod:`outboxkit.inbox.batch`) the claimed, decoded events it handles are grouped by
:func:`rounds` and handed to it in **one call**, in fetch order, in the batch's transaction
(as every handler of a batch: first without a savepoint, after a failure in one). The decisions
here:

* **partition order holds**: a group takes an event only if nothing unsettled comes before it
  in its partition (an event of another handler not run yet, or one held behind a failure).
  Events behind such a record wait for a later group of the same transaction. With one event
  type per partition that is one call per batch;
* **a failing call falls back** (:func:`bulk_call` tells the batch it failed): its writes are
  rolled back (its savepoint, or the whole optimistic run, which then runs again with
  savepoints) and the batch calls the handler again once per event (``[event]``, each in its
  own savepoint, as a per-event handler), so a poison event takes the retry/dead path alone
  and the others' writes commit once. An event whose lease is lost meanwhile is not called
  again. The fallback is the same attempt: ``attempts`` counts claims, not calls;
* **outside a bulk call** (one record at a time: ``batch_max_records=1``, ``poll_once``, a
  retry or takeover, which always runs alone, the one-by-one fallback of a broken batch) the
  handler is called with ``[event]`` through :class:`OneAtATime`.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Hashable, Iterator, Sequence
from typing import Any, TypeVar

from outboxkit.errors import BatchTransactionEndedError
from outboxkit.inbox.context import BatchContext, HandlerContext
from outboxkit.inbox.guard import error_text
from outboxkit.inbox.steps import Plan, RunInTransaction

logger = logging.getLogger("outboxkit.inbox.middleware")

M = TypeVar("M")


class OneAtATime:
    """A batch handler seen as a per-event handler: ``fn([event], BatchContext.of(ctx), s)``.

    Returns what the function returns (``None``, or a coroutine for the async inbox), so the
    drivers call it like any handler.
    """

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn

    def __call__(self, event: Any, ctx: HandlerContext, session: Any) -> Any:
        return self.fn([event], BatchContext.of(ctx), session)

    def __repr__(self) -> str:
        return f"OneAtATime({getattr(self.fn, '__qualname__', self.fn)!r})"


def rounds(
    items: Sequence[M],
    partition: Callable[[M], Hashable],
    bulk: Callable[[M], object | None],
    held: Callable[[M], bool],
) -> Iterator[list[M]]:
    """The items in the order to run them: lists of one (a per-event handler, or a held item),
    or a bulk group (the items of the first item's batch handler with nothing unsettled before
    them in their partition). Lazy: ``held`` is asked again after each list has run."""
    remaining = deque(items)
    while remaining:
        head = remaining.popleft()
        fn = bulk(head)
        if fn is None or held(head):
            yield [head]
            continue
        group, rest, blocked = [head], deque[M](), set[Hashable]()
        for item in remaining:
            tp = partition(item)
            if tp not in blocked and bulk(item) is fn and not held(item):
                group.append(item)
            else:
                blocked.add(tp)
                rest.append(item)
        remaining = rest
        yield group


def bulk_call(
    run: type[RunInTransaction],
    fn: Callable[..., Any],
    events: Sequence[Any],
    contexts: Sequence[HandlerContext],
) -> Plan[bool]:
    """Call ``fn`` once with all ``events`` (every lease checked after it) as ``run`` says (in
    the transaction, or in a savepoint): whether it went well. A failure is reported as
    ``False`` (the caller runs the events one by one); only a transaction the handler ended
    goes up."""
    ctx = BatchContext(contexts[0].consumer, tuple(contexts))
    try:
        yield run(fn, (list(events), ctx), ctx.contexts)
    except BatchTransactionEndedError:
        raise
    except Exception as exc:
        name = getattr(fn, "__qualname__", repr(fn))
        logger.info(
            "batch handler %s failed for %d events (%s); calling it once per event",
            name,
            len(ctx),
            error_text(exc),
        )
        return False
    return True
