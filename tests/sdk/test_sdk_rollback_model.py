"""The seven rollback invariants of agent-saga's bounded model check, enumerated exhaustively.

For every saga of 1..5 steps we try every failing step (or a failure in the body after the
last step), every subset of compensations that fail, every choice of one step with no
inverse (or none), with and without halting. Each run is compared with an independent
reference model and checked against the invariants and against its own WAL records.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import sagaplane as sp
from sagaplane.chain import verify_chain
from sagaplane_testkit import read_wal

MAX_ATTEMPTS = 2


class Boom(Exception):
    pass


def expected_outcomes(executed: int, no_inverse: int | None, failing: set[int], halt: bool) -> dict[int, str]:
    """Reference model, written independently of the engine: walk newest to oldest."""
    out: dict[int, str] = {}
    halted = False
    for i in range(executed, 0, -1):
        if halted:
            out[i] = "unresolved"
        elif i == no_inverse:
            out[i] = "orphaned"
        elif i in failing:
            out[i] = "failed"
            halted = halt
        else:
            out[i] = "compensated"
    return out


def run_case(
    wal: sp.WAL, n: int, fail_at: int | None, failing: set[int], no_inverse: int | None, halt: bool
) -> tuple[sp.RollbackReport, list[tuple[int, int]], sp.Saga]:
    calls: list[tuple[int, int]] = []  # (step index, attempt) in call order
    attempts: dict[int, int] = {}

    def make_undo(i: int) -> Any:
        def undo_step() -> None:
            attempts[i] = attempts.get(i, 0) + 1
            calls.append((i, attempts[i]))
            if i in failing:
                raise RuntimeError(f"undo {i} failed")

        return undo_step

    def make_tool(i: int) -> Any:
        def forward() -> int:
            if i == fail_at:
                raise Boom(f"step {i}")
            return i

        # The factory ignores the result, so a step whose forward raised (UNKNOWN) is still compensable.
        compensate = None if i == no_inverse else (lambda _r, i=i: sp.Compensation(fn=make_undo(i)))
        return sp.tool(forward, semantics=sp.COMPENSABLE, compensate=compensate, name=f"t{i}")

    tools = [make_tool(i) for i in range(1, n + 1)]
    saga = sp.Saga("model", wal=wal, halt_on_failure=halt, max_attempts=MAX_ATTEMPTS, retry_delay=0)
    with pytest.raises(sp.SagaAborted) as info, saga:
        for t in tools:
            t()
        raise Boom("body")
    return info.value.report, calls, saga


CASES = [
    (n, fail_at, frozenset(failing), no_inverse, halt)
    for n in range(1, 6)
    for fail_at in [*range(1, n + 1), None]
    for r in range(n + 1)
    for failing in itertools.combinations(range(1, n + 1), r)
    for no_inverse in [None, *range(1, n + 1)]
    for halt in (True, False)
]


@pytest.mark.parametrize("n", range(1, 6))
def test_rollback_invariants_exhaustive(tmp_path: Any, n: int) -> None:
    wal = sp.WAL(tmp_path / "model.wal", fsync=False)
    cases = [c for c in CASES if c[0] == n]
    for _n, fail_at, failing_fs, no_inverse, halt in cases:
        failing = set(failing_fs)
        report, calls, saga = run_case(wal, n, fail_at, failing, no_inverse, halt)
        executed = fail_at or n
        case = f"n={n} fail_at={fail_at} failing={sorted(failing)} no_inverse={no_inverse} halt={halt}"
        steps = {s.index: s for s in saga.steps}
        assert sorted(steps) == list(range(1, executed + 1)), case

        # 1. LIFO: compensations are attempted newest first.
        order = [i for i, attempt in calls if attempt == 1]
        assert order == sorted(order, reverse=True), case
        # 2. No double compensation: a compensation that succeeded is never called again.
        for i in steps:
            successes = [a for j, a in calls if j == i and i not in failing]
            assert len(successes) <= 1, case
        # 3. Bounded retries: failing ones are tried exactly MAX_ATTEMPTS times, others once.
        for i in set(order):
            tries = sum(1 for j, _ in calls if j == i)
            assert tries == (MAX_ATTEMPTS if i in failing else 1), case
        # 4. Exactly one outcome per executed step, and it is the one the reference model predicts.
        outcomes: dict[int, str] = {}
        for label in ("compensated", "failed", "orphaned", "unresolved", "skipped"):
            for s in getattr(report, label):
                assert s.index not in outcomes, case
                outcomes[s.index] = label
        assert outcomes == expected_outcomes(executed, no_inverse, failing, halt), case
        # 5. Clean only when nothing failed, was orphaned, or left unresolved.
        assert report.clean == all(v == "compensated" for v in outcomes.values()), case
        # 6. Halting strands only earlier steps (lower index than the first failure).
        if report.failed and halt:
            first_failed = max(s.index for s in report.failed)
            assert report.halted, case
            assert all(s.index < first_failed for s in report.unresolved), case
            assert len(report.failed) == 1, case
        else:
            assert not report.unresolved and not report.halted, case
        # 7. Orphans are reported: in the report and as STEP_ORPHANED in the log.
        if no_inverse is not None and no_inverse <= executed and outcomes[no_inverse] != "unresolved":
            assert [s.index for s in report.orphaned] == [no_inverse], case
        # Nothing runs that was not executed, and never a step that was stranded.
        assert {i for i, _ in calls} <= {i for i, v in outcomes.items() if v in ("compensated", "failed")}, (
            case
        )

    wal.close()
    records = read_wal(tmp_path / "model.wal")
    assert verify_chain(records).intact
    ends = [r for r in records if r["event"] == "ROLLBACK_END"]
    assert len(ends) == len(cases)
    aborted = [r for r in records if r["event"] == "SAGA_ABORTED"]
    assert [a["clean"] for a in aborted] == [e["clean"] for e in ends]
    orphan_records = sum(1 for r in records if r["event"] == "STEP_ORPHANED")
    assert orphan_records == sum(e["orphaned"] for e in ends)


def test_case_count_covers_the_space() -> None:
    # sum over n of (n+1 failure points) * 2^n subsets * (n+1) inverse choices * 2 halting modes
    assert len(CASES) == sum((n + 1) * 2**n * (n + 1) * 2 for n in range(1, 6))
