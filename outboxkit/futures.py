"""Futures nobody will await: their outcome read as they end.

asyncio reports a future that ended with an exception nobody read as an ERROR with a traceback
("exception was never retrieved"). A task or future the code gives up on (a shielded read past
its wait, a batch of a send that timed out, a producer abandoned) gets :func:`retrieved` as a
done callback instead.
"""

from __future__ import annotations

import asyncio
from typing import Any


def retrieved(future: asyncio.Future[Any]) -> None:
    """A done callback: the future's exception, if any, taken as read."""
    if not future.cancelled():
        future.exception()
