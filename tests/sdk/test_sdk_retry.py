"""Retries and a fallback inside one step (`sp.tool(retry=, fallback=)`, sagaplane.retry): every
attempt is the same step (one intent, one gate answer, one idempotency key), each failed attempt a
STEP_ATTEMPT record, the backoff's shape, which exceptions retry, and when the fallback runs."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sagaplane as sp
from hypothesis import given
from hypothesis import strategies as st
from sagaplane.gate import Call, GateDenied
from sagaplane.saga import set_default_gate
from sagaplane_testkit import read_wal


class Gate:
    """The gate's interface, scripted: allows (with an approval) unless a tool is listed in `deny`."""

    def __init__(self) -> None:
        self.calls: list[Call] = []
        self.deny: set[str] = set()

    def check(self, call: Call) -> dict[str, Any] | None:
        self.calls.append(call)
        if call.tool in self.deny:
            raise GateDenied("halted", {"halt_reason": "test"})
        return {"decision": "allow", "authorization_id": f"az-{len(self.calls)}", "approvals": ["ap1"]}


@pytest.fixture
def gate() -> Iterator[Gate]:
    fake = Gate()
    set_default_gate(fake)  # type: ignore[arg-type]
    yield fake
    set_default_gate(None)


class Flaky:
    """A tool failing its first `failures` calls with `error`, recording what each call was given."""

    def __init__(self, failures: int, error: type[Exception] = TimeoutError) -> None:
        self.failures = failures
        self.error = error
        self.keys: list[str] = []

    def __call__(self, amount: int, idempotency_key: str = "") -> dict[str, Any]:
        self.keys.append(idempotency_key)
        if len(self.keys) <= self.failures:
            raise self.error(f"attempt {len(self.keys)} failed")
        return {"id": f"ch_{amount}"}


def pauses() -> tuple[list[float], Any]:
    slept: list[float] = []
    return slept, slept.append


def events(path: Path) -> list[dict[str, Any]]:
    return [r for r in read_wal(path) if r["event"] not in ("SAGA_LEASE",)]


def test_attempts_are_one_step_one_key_one_gate_answer(tmp_path: Path, gate: Gate) -> None:
    slept, sleep = pauses()
    flaky = Flaky(2)
    charge = sp.tool(
        flaky,
        name="pay.charge",
        semantics=sp.COMPENSABLE,
        compensate=lambda r: sp.undo("retry.refund", charge_id=r["id"]),
        retry=sp.Retry(max_attempts=3, base_s=0.5, jitter=False, sleep=sleep),
    )
    with sp.WAL(tmp_path / "a.wal", fsync=False) as wal, sp.saga(name="r", wal=wal) as saga:
        assert charge(amount=5) == {"id": "ch_5"}
    records = events(tmp_path / "a.wal")
    kinds = [r["event"] for r in records]
    assert kinds == [
        "SAGA_START",
        "GATE_ALLOW",
        "STEP_INTENT",
        "STEP_ATTEMPT",
        "STEP_ATTEMPT",
        "STEP_COMMITTED",
        "SAGA_COMPLETE",
    ]
    assert len(gate.calls) == 1  # one gate answer (one approval, one debit) for every attempt
    assert len(set(flaky.keys)) == 1 and flaky.keys[0] == sp.idempotency_key(
        saga.saga_id, saga.steps[0].step_id, "forward"
    )
    tries = [r for r in records if r["event"] == "STEP_ATTEMPT"]
    assert [(t["attempt"], t["next"], t["delay_s"], t["outcome"]) for t in tries] == [
        (1, "retry", 0.5, "unknown"),
        (2, "retry", 1.0, "unknown"),
    ]
    assert {t["step_id"] for t in tries} == {saga.steps[0].step_id}
    assert all(t["idempotency_key"] == flaky.keys[0] for t in tries)
    assert "attempt 1 failed" in tries[0]["error"]
    assert records[-2]["attempts"] == 3
    assert slept == [0.5, 1.0]


def test_exhausted_retries_end_the_step_unknown_and_it_is_compensated(tmp_path: Path) -> None:
    refunds: list[str] = []
    sp.compensator("retry.refund2")(
        lambda charge_id, amount, idempotency_key=None: refunds.append(idempotency_key)
    )
    charge = sp.tool(
        Flaky(5),
        name="pay.charge2",
        semantics=sp.COMPENSABLE,
        compensate=lambda r, kwargs: sp.undo("retry.refund2", amount=kwargs["amount"], charge_id="x"),
        retry=sp.Retry(max_attempts=2, jitter=False, sleep=lambda s: None),
    )
    with (
        sp.WAL(tmp_path / "a.wal", fsync=False) as wal,
        pytest.raises(sp.SagaAborted) as aborted,
        sp.saga(name="r", wal=wal),
    ):
        charge(amount=7)
    assert aborted.value.report.compensated and len(refunds) == 1
    records = events(tmp_path / "a.wal")
    unknown = next(r for r in records if r["event"] == "STEP_UNKNOWN")
    assert unknown["attempts"] == 2 and "attempt 2 failed" in unknown["error"]
    assert [r["attempt"] for r in records if r["event"] == "STEP_ATTEMPT"] == [1]


@pytest.mark.parametrize(
    ("policy", "retried"),
    [
        (sp.Retry(retry_on=(ConnectionError,)), False),  # TimeoutError is not a ConnectionError
        (sp.Retry(retry_on=("TimeoutError",)), True),  # by name, anywhere in the MRO
        (sp.Retry(retry_on=("builtins.OSError",)), True),
        (sp.Retry(no_retry_on=(TimeoutError,)), False),
        (sp.Retry(retry_on=(OSError,), no_retry_on=("ValueError",)), True),
    ],
)
def test_which_exceptions_retry(tmp_path: Path, policy: sp.Retry, retried: bool) -> None:
    object.__setattr__(policy, "sleep", lambda s: None)
    flaky = Flaky(1)
    charge = sp.tool(
        flaky, name="pay.kinds", semantics=sp.REVERSIBLE, compensate=lambda r: None, retry=policy
    )
    with sp.WAL(tmp_path / "a.wal", fsync=False) as wal:
        try:
            with sp.saga(name="r", wal=wal):
                charge(amount=1)
        except sp.SagaAborted:
            pass
    assert len(flaky.keys) == (2 if retried else 1)


@given(
    attempt=st.integers(min_value=1, max_value=200),
    base=st.floats(min_value=0, max_value=100),
    cap=st.floats(min_value=0, max_value=1000),
    backoff=st.sampled_from(["exponential", "linear"]),
    seed=st.integers(min_value=0, max_value=2**32),
)
def test_the_backoff_grows_to_its_cap_and_jitter_stays_under_it(
    attempt: int, base: float, cap: float, backoff: str, seed: int
) -> None:
    plain = sp.Retry(backoff=backoff, base_s=base, cap_s=cap, jitter=False)
    raw = plain.delay(attempt)
    expected = base * 2.0 ** (attempt - 1) if backoff == "exponential" else base * attempt
    assert raw == min(expected, cap)
    assert plain.delay(attempt + 1) >= raw  # never shrinks
    jittered = sp.Retry(backoff=backoff, base_s=base, cap_s=cap, rng=random.Random(seed))
    assert 0 <= jittered.delay(attempt) <= raw


@pytest.mark.parametrize(
    "bad",
    [{"max_attempts": 0}, {"backoff": "fibonacci"}, {"base_s": -1}, {"cap_s": float("nan")}],
)
def test_a_retry_policy_is_checked_when_made(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="Retry"):
        sp.Retry(**bad)


def test_the_fallback_completes_the_step_once_no_attempt_may_have_applied(tmp_path: Path, gate: Gate) -> None:
    backups: list[tuple[int, str]] = []
    sp.compensator("retry.backup_refund")(lambda charge_id: None)

    @sp.tool(
        name="pay.backup",
        semantics=sp.COMPENSABLE,
        compensate=lambda r: sp.undo("retry.backup_refund", charge_id=r["id"]),
    )
    def backup(amount: int) -> dict[str, Any]:
        backups.append((amount, "backup"))
        return {"id": f"bk_{amount}"}

    primary = sp.tool(
        Flaky(9, sp.EffectNotApplied),
        name="pay.primary",
        semantics=sp.COMPENSABLE,
        compensate=lambda r: None,
        retry=sp.Retry(max_attempts=2, sleep=lambda s: None),
        fallback=backup,
    )
    with sp.WAL(tmp_path / "a.wal", fsync=False) as wal, sp.saga(name="r", wal=wal) as saga:
        assert primary(amount=3) == {"id": "bk_3"}
    assert backups == [(3, "backup")]
    step = saga.steps[0]
    assert step.fallback == "pay.backup" and step.compensation is not None
    assert step.compensation.handler == "retry.backup_refund"
    records = events(tmp_path / "a.wal")
    last_try = [r for r in records if r["event"] == "STEP_ATTEMPT"][-1]
    assert last_try["next"] == "fallback" and last_try["outcome"] == "not_applied"
    assert last_try["fallback"] == {"tool": "pay.backup", "semantics": "COMPENSABLE", "kwargs": {"amount": 3}}
    done = next(r for r in records if r["event"] == "COMPLETED_VIA_FALLBACK")
    assert done["step_id"] == step.step_id and done["fallback"] == "pay.backup" and done["attempts"] == 2
    assert done["compensation"]["handler"] == "retry.backup_refund"
    # The gate: once for the step, once for the fallback (another tool: its halts hold).
    assert [(c.tool, c.step_id) for c in gate.calls] == [
        ("pay.primary", step.step_id),
        ("pay.backup", f"{step.step_id}:fallback"),
    ]


def test_no_fallback_after_an_attempt_whose_outcome_is_unknown(tmp_path: Path) -> None:
    called: list[int] = []
    backup = sp.tool(lambda amount: called.append(amount), name="pay.backup2", semantics=sp.IRREVERSIBLE)
    primary = sp.tool(
        Flaky(9, TimeoutError),
        name="pay.primary2",
        semantics=sp.COMPENSABLE,
        compensate=lambda r: None,
        retry=sp.Retry(max_attempts=2, sleep=lambda s: None),
        fallback=backup,
    )
    with (
        sp.WAL(tmp_path / "a.wal", fsync=False) as wal,
        pytest.raises(sp.SagaAborted),
        sp.saga(name="r", wal=wal),
    ):
        primary(amount=3)
    assert called == []
    assert "STEP_UNKNOWN" in [r["event"] for r in events(tmp_path / "a.wal")]


def test_a_fallback_the_gate_refuses_does_not_run(tmp_path: Path, gate: Gate) -> None:
    called: list[int] = []
    sp.tool(lambda amount: called.append(amount), name="pay.backup3", semantics=sp.PREVIEW)
    gate.deny.add("pay.backup3")
    primary = sp.tool(
        Flaky(9, sp.EffectNotApplied), name="pay.primary3", semantics=sp.PREVIEW, fallback="pay.backup3"
    )
    with (
        sp.WAL(tmp_path / "a.wal", fsync=False) as wal,
        pytest.raises(sp.SagaAborted) as aborted,
        sp.saga(name="r", wal=wal),
    ):
        primary(amount=3)
    assert called == [] and isinstance(aborted.value.cause, sp.EffectNotApplied)
    kinds = [r["event"] for r in events(tmp_path / "a.wal")]
    assert "GATE_DENY" in kinds and "STEP_FAILED" in kinds and "COMPLETED_VIA_FALLBACK" not in kinds


def test_async_tools_retry_and_fall_back_too(tmp_path: Path) -> None:
    slept: list[float] = []

    async def pause(seconds: float) -> None:
        slept.append(seconds)

    calls: list[str] = []

    async def backup_fn(amount: int) -> str:
        calls.append("backup")
        return "backup"

    async def primary_fn(amount: int) -> str:
        calls.append("primary")
        raise sp.EffectNotApplied("declined")

    backup = sp.tool(backup_fn, name="pay.abackup", semantics=sp.REVERSIBLE, compensate=lambda r: None)
    primary = sp.tool(
        primary_fn,
        name="pay.aprimary",
        semantics=sp.REVERSIBLE,
        compensate=lambda r: None,
        retry=sp.Retry(max_attempts=3, backoff="linear", base_s=1, jitter=False, sleep=pause),
        fallback=backup,
    )

    async def run() -> str:
        with sp.WAL(tmp_path / "a.wal", fsync=False) as wal:
            async with sp.saga(name="r", wal=wal):
                return str(await primary(amount=1))

    assert asyncio.run(run()) == "backup"
    assert calls == ["primary"] * 3 + ["backup"] and slept == [1.0, 2.0]
    kinds = [r["event"] for r in events(tmp_path / "a.wal")]
    assert kinds.count("STEP_ATTEMPT") == 3 and "COMPLETED_VIA_FALLBACK" in kinds


class HaltingGate(Gate):
    """Allows the step, then a halt on its tool reaches the agent (the long-poll's fleet state)."""

    def __init__(self) -> None:
        super().__init__()
        self.halts: list[dict[str, Any]] = []

    def halt_for(self, call: Call) -> dict[str, Any] | None:
        return next((h for h in self.halts if h["scope"] == f"tool:{call.tool}"), None)


def test_a_halt_that_reaches_the_agent_stops_the_retries(tmp_path: Path) -> None:
    gate = HaltingGate()
    set_default_gate(gate)  # type: ignore[arg-type]
    calls: list[int] = []

    def flaky(amount: int) -> None:
        calls.append(amount)
        gate.halts.append({"scope": "tool:pay.halted", "reason": "card incident", "mode": "halt"})
        raise TimeoutError("slow")

    tool = sp.tool(
        flaky, name="pay.halted", semantics=sp.PREVIEW, retry=sp.Retry(max_attempts=5, sleep=lambda s: None)
    )
    try:
        with (
            sp.WAL(tmp_path / "a.wal", fsync=False) as wal,
            pytest.raises(sp.SagaAborted),
            sp.saga(name="r", wal=wal),
        ):
            tool(1)
    finally:
        set_default_gate(None)
    assert calls == [1]  # no second attempt once the halt is known
    deny = next(r for r in events(tmp_path / "a.wal") if r["event"] == "GATE_DENY")
    assert deny["reason"] == "halted" and deny["answer"]["halt_reason"] == "card incident"
