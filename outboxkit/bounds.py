"""Range checks of the Python API's own numeric arguments (the settings models check theirs with
pydantic).

A check written ``if x < 0: raise`` lets NaN through (every comparison with it is false) and
says nothing of infinity; a NaN retry delay or an infinite interval then stalls a partition or
a loop long after the object was built. So each check here asks that the value lie *inside* its
range, which NaN never does, and names the argument and the range (never anything but a number
it was given), in an :class:`~outboxkit.errors.OutOfRangeError` (a ``ValueError`` too).

A check returns the number to keep: an ``int`` as given, anything else as the ``float`` it was
checked as. A ``Decimal`` kept as such would fail later, at the first arithmetic with a float
(``time.time() - Decimal(...)`` is a TypeError), long after the object was built.
"""

from __future__ import annotations

import math
from decimal import Decimal

from outboxkit.errors import OutOfRangeError


def _number(value: float) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return f"{value:g}" if isinstance(value, float) else str(value)


def _accepted(value: object, integer: bool) -> bool:
    """``int``, and for a non-integer also ``float`` or ``Decimal`` (kept as a float). Other
    numbers (``Fraction``, numpy scalars) pass a comparison but not every driver, so they are
    refused here, by name."""
    if isinstance(value, bool):
        return False
    return isinstance(value, int) if integer else isinstance(value, int | float | Decimal)


def _shown(value: object, integer: bool) -> str:
    """The number as given (NaN, inf too); of anything else only its type."""
    if not _accepted(value, False):
        return f"a {type(value).__name__}"
    if isinstance(value, int):
        text = str(value)
        return text if len(text) <= 20 else f"an integer of {len(text)} digits"
    if integer:  # 5.0 is not an integer: say so rather than print "5"
        return f"{value!r} (a {type(value).__name__})"
    if isinstance(value, Decimal):
        return str(value)
    return _number(float(value))  # type: ignore[arg-type]


def _inside(
    value: object, low: float, high: float | None, *, above: bool, integer: bool
) -> float | None:
    """The number to keep (an ``int`` as given, else a ``float``) if inside the range."""
    if not _accepted(value, integer):
        return None
    try:
        number = value if isinstance(value, int) else float(value)  # type: ignore[arg-type]
    except OverflowError:
        return None
    if isinstance(number, float) and not math.isfinite(number):
        return None
    inside = (number > low if above else number >= low) and (high is None or number <= high)
    return number if inside else None


def check_range(
    name: str,
    value: object,
    low: float,
    high: float | None = None,
    *,
    above: bool = False,
    integer: bool = False,
    unit: str = "",
    error: type[Exception] = OutOfRangeError,
) -> float:
    """Raise ``error`` unless ``value`` is a finite number (an ``int`` if ``integer``) from
    ``low`` (exclusive if ``above``) to ``high`` (inclusive; ``None``: no upper bound);
    return the number to keep (see the module's docstring)."""
    number = _inside(value, low, high, above=above, integer=integer)
    if number is not None:
        return number
    if high is None:
        span = f"above {_number(low)}" if above else f"at least {_number(low)}"
    elif above:
        span = f"above {_number(low)} and at most {_number(high)}"
    else:
        span = f"between {_number(low)} and {_number(high)}"
    what = "an integer" if integer else "a finite number"
    suffix = f" {unit}" if unit else ""
    raise error(f"{name} must be {what} {span}{suffix}, not {_shown(value, integer)}")


def keep(obj: object, **numbers: float) -> None:
    """Store checked numbers on a frozen dataclass (from its ``__post_init__``)."""
    for name, number in numbers.items():
        object.__setattr__(obj, name, number)
