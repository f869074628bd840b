"""Reserve, then settle: a tool whose cost is known only after it ran (tokens, a metered API).

    ask = sp.tool(call_model, name="llm.complete", semantics=sp.REVERSIBLE,
                  reserve=lambda **kw: kw["max_tokens"])

    def call_model(prompt, max_tokens):
        reply = client.complete(prompt, max_tokens=max_tokens)
        sp.settle(reply.usage.total_tokens)   # inside the tool, while its step runs
        return reply

`reserve` is called with the call's arguments (by name) before the gate is asked; the gate debits
that estimate from every budget the tool meets, instead of the budgets' argument. `sp.settle(actual)`
inside the tool records the real amount: the step's outcome record in the WAL carries it
(`settle: {reservation_id, actual}`), and the control plane settles when the shipper delivers it —
the difference returns to the budgets, an actual above the estimate is recorded as an overrun and
counted against them. A reservation never settled is settled at its estimate when the saga ends.
An ungoverned call (no budget, no reservation) ignores `sp.settle`.
"""

from __future__ import annotations

import math
from contextvars import ContextVar
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .steps import Step

# The step whose effect runs in this context (set when its intent is written).
running_step: ContextVar[Step | None] = ContextVar("sagaplane_running_step", default=None)

MAX_AMOUNT = Decimal(10**11)  # the control plane's largest amount (whole units)


def amount(value: Any, what: str) -> str:
    """`value` as an exact decimal string; ValueError unless it is a finite non-negative number."""
    if isinstance(value, bool) or not isinstance(value, int | float | Decimal | str):
        raise ValueError(f"{what}: a number, not {type(value).__name__}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{what}: must be finite")
    try:
        number = Decimal(str(value))
    except InvalidOperation:
        raise ValueError(f"{what}: a number, not {value!r}") from None
    if not number.is_finite() or number < 0 or number > MAX_AMOUNT:
        raise ValueError(f"{what}: a finite number from 0 to {MAX_AMOUNT}")
    return format(number.normalize(), "f") if number else "0"


def settle(actual: Any) -> None:
    """Settle the reservation of the step running here at `actual` (its real cost). Raises
    ValueError for anything but a finite non-negative number, and RuntimeError outside a step."""
    from .steps import StepState

    step = running_step.get()
    if step is None or step.state is not StepState.INTENT:
        raise RuntimeError("sp.settle() is called inside a tool, while its step runs")
    step.actual = amount(actual, "actual")
