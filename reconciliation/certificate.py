"""The certificate's content: every committed effect of the sagas active in a range, accounted for
or named as an exception (the format: `sagaplane.certificate`).

An effect is a step whose forward call committed, or may have (outcome unknown); a PREVIEW step
and a step whose effect never ran (an intent in a finished saga: the tool said nothing happened)
are not effects. An effect is accounted for when it is

- `completed`: committed in a saga that completed;
- `compensated_confirmed`: compensated, and its observer confirmed the reversal;
- `resolved`: explicitly made terminal by a person (a recovery resolution naming the step).

Everything else is an exception, with its reason: `drift`, `unverifiable` and `unreconciled`
(compensated, but the observer found it standing, could not tell, or has not answered yet),
`compensation_failed`, `orphaned` (ran and has no inverse), `not_compensated` (committed in a
saga that was rolled back), `outcome_unknown`, `in_flight` (its saga has not finished),
`quarantined` (set aside by a person, not resolved).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from reconciliation.models import CheckStatus, ReconciliationCheck
from sagas.models import SagaStatus, StepStatus
from sagas.selectors import Effect

TERMINAL = {SagaStatus.COMPLETED, SagaStatus.ROLLED_BACK, SagaStatus.ROLLBACK_PARTIAL, SagaStatus.QUARANTINED}
ROLLED_BACK = {SagaStatus.ROLLED_BACK, SagaStatus.ROLLBACK_PARTIAL}
ACCOUNTED = ("completed", "compensated_confirmed", "resolved")


@dataclass
class Tally:
    effects: int = 0
    accounted: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ACCOUNTED, 0))
    exceptions: list[dict[str, Any]] = field(default_factory=list)


def classify(effect: Effect, check: ReconciliationCheck | None) -> str | None:
    """What `effect` is: an ACCOUNTED kind, an exception reason, or None (not an effect)."""
    saga, status = effect.saga_status, effect.status
    if effect.semantics == "PREVIEW":
        return None
    if status == StepStatus.INTENT:
        return None if saga in TERMINAL else "in_flight"
    if status == StepStatus.COMPENSATED:
        if check is None or check.status not in (
            CheckStatus.CONFIRMED,
            CheckStatus.DRIFT,
            CheckStatus.UNVERIFIABLE,
        ):
            return "unreconciled"
        return {CheckStatus.CONFIRMED: "compensated_confirmed", CheckStatus.DRIFT: "drift"}.get(
            CheckStatus(check.status), "unverifiable"
        )
    if status == StepStatus.COMPENSATION_FAILED:
        return "compensation_failed"
    if status == StepStatus.ORPHANED:
        return "orphaned"
    if saga == SagaStatus.QUARANTINED:
        return "quarantined"
    if saga not in TERMINAL:
        return "in_flight"
    if status == StepStatus.UNKNOWN:
        return "outcome_unknown"
    if saga in ROLLED_BACK:
        return "not_compensated"
    return "completed"


def tally(
    effects: Iterable[Effect],
    checks: dict[tuple[str, str], ReconciliationCheck],
    resolved: set[tuple[str, str]] | frozenset[tuple[str, str]] = frozenset(),
) -> Tally:
    out = Tally()
    for effect in effects:
        key = (effect.saga_id, effect.step_id)
        check = checks.get(key)
        kind = classify(effect, check)
        if kind is None:
            continue
        out.effects += 1
        if kind not in ACCOUNTED and key in resolved:
            kind = "resolved"
        if kind in ACCOUNTED:
            out.accounted[kind] += 1
            continue
        exception: dict[str, Any] = {
            "saga_id": effect.saga_id,
            "step_id": effect.step_id,
            "tool": effect.tool,
            "reason": kind,
            "step_status": effect.status,
            "saga_status": effect.saga_status,
        }
        if check is not None:
            exception["check"] = str(check.pk)
            if check.reason:
                exception["detail"] = check.reason
        out.exceptions.append(exception)
    return out
