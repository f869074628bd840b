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
