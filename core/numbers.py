"""Numbers from JSON bodies: Python parses a JSON integer of any length (up to int()'s digit limit)
into an int that no float can hold, and `math.isfinite`/`float()` raise OverflowError on it."""

from __future__ import annotations

import math
import sys
from typing import Any, TypeGuard


def finite_number(value: Any) -> TypeGuard[int | float]:
    """`value` is an int or a float (not a bool), finite, and within a float's range (so
    `float(value)` and `math.isfinite(value)` cannot raise). int-float comparison is exact."""
    if type(value) is float:
        return math.isfinite(value)
    return type(value) is int and abs(value) <= sys.float_info.max


def amount_text(value: Any, currency: Any = None) -> str:
    """An amount as people read it: `25000` -> `25,000`, with the call's currency code after it
    when it named one (`25,000.50 EUR`); what is not a number is shown as it is, `—` for none.
    The one formatting of amounts (the dashboard's `money` filter, the Slack messages)."""
    if value is None or value == "":
        return "—"
    if isinstance(value, bool) or not finite_number(value):
        return str(value)
    text = f"{value:,}" if isinstance(value, int) else f"{value:,.2f}"
    code = currency.strip() if isinstance(currency, str) else ""
    return f"{text} {code}" if 0 < len(code) <= 8 else text


# Integers in request text (path segments, query parameters, headers, form fields). `str.isdigit()`
# and `int()` accept far more than ASCII digits: '²' is a digit that int() refuses (a 500 where
# it was trusted), '٤' and '４' parse as 4, and int() also takes ' 7', '+7', '1_0'. An id is at
# most ID_MAX_DIGITS ASCII digits, which every bigint column holds.
ID_MAX_DIGITS = 18
_ASCII_DIGITS = frozenset("0123456789")


def ascii_int(text: str, *, max_digits: int = ID_MAX_DIGITS) -> int | None:
    """`text` as a non-negative int when it is 1 to `max_digits` ASCII digits and nothing else;
    None otherwise. The one parser of integers a request spells."""
    if not 0 < len(text) <= max_digits or not _ASCII_DIGITS.issuperset(text):
        return None
    return int(text)


class IdConverter:
    """The path converter every route with an integer id uses (`<id:name>`, registered once in
    controlplane/urls.py): ASCII digits, at most ID_MAX_DIGITS; any other segment does not match
    the route, so it is answered 404 before a view runs."""

    regex = f"[0-9]{{1,{ID_MAX_DIGITS}}}"

    def to_python(self, value: str) -> int:
        return int(value)

    def to_url(self, value: int | str) -> str:
        return str(value)
