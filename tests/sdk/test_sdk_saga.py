"""Saga engine behaviour beyond the exhaustive model: forms, partial rollback, async, hooks."""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

import pytest
import sagaplane as sp
from sagaplane.chain import verify_chain
from sagaplane_testkit import read_wal

REFUNDS: list[dict[str, Any]] = []


@sp.compensator("test.refund")
def refund(charge_id: str, idempotency_key: str) -> None:
    REFUNDS.append({"charge_id": charge_id, "key": idempotency_key})


def charge_card(amount: int) -> dict[str, Any]:
    return {"id": f"ch_{amount}", "amount": amount}


charge = sp.tool(
    charge_card, semantics=sp.COMPENSABLE, compensate=lambda r: sp.undo("test.refund", charge_id=r["id"])
)


@pytest.fixture
def wal(tmp_path: Any) -> Any:
    REFUNDS.clear()
    w = sp.WAL(tmp_path / "agent.wal")
    yield w
    w.close()


def events(path: Any) -> list[str]:
    return [r["event"] for r in read_wal(path)]


def test_tool_outside_a_saga_runs_untouched(wal: sp.WAL) -> None:
    assert charge(5) == {"id": "ch_5", "amount": 5}
    assert sp.current_saga() is None
    assert read_wal(wal.path) == []


def test_clean_saga_logs_intent_commit_and_descriptor(wal: sp.WAL) -> None:
    with sp.saga(name="checkout", wal=wal) as s:
        charge(7)
    assert s.status == "complete"
    recs = read_wal(wal.path)
    assert [r["event"] for r in recs] == ["SAGA_START", "STEP_INTENT", "STEP_COMMITTED", "SAGA_COMPLETE"]
    start, intent, commit, _ = recs
    assert start["name"] == "checkout" and start["lease_ttl"] == s.lease_ttl and isinstance(start["pid"], int)
    assert intent["kwargs"] == {"amount": 7} and intent["semantics"] == "COMPENSABLE"
    comp = commit["compensation"]
    assert comp["handler"] == "test.refund" and comp["recoverable"] is True
    assert comp["kwargs"] == {"charge_id": "ch_7"}
    assert set(comp) == {"fn", "handler", "recoverable", "description", "idempotency_key", "kwargs"}
    expected_key = hashlib.sha256(f"{s.saga_id}:{intent['step_id']}:compensate".encode()).hexdigest()
    assert comp["idempotency_key"] == expected_key
    assert verify_chain(recs).intact


def test_failure_compensates_with_deterministic_idempotency_key(wal: sp.WAL) -> None:
    with pytest.raises(sp.SagaAborted) as info, sp.saga(name="x", wal=wal) as s:
        charge(1)
        charge(2)
        raise ValueError("model said no")
    report = info.value.report
    assert report.clean and [st.index for st in report.compensated] == [2, 1]
    assert [r["charge_id"] for r in REFUNDS] == ["ch_2", "ch_1"]
    assert REFUNDS[0]["key"] == sp.idempotency_key(s.saga_id, s.steps[1].step_id, "compensate")
    assert isinstance(info.value.cause, ValueError)
    ev = events(wal.path)
    assert ev[-6:] == [
        "SAGA_ABORT_CAUSE",
        "ROLLBACK_START",
        "COMPENSATED",
        "COMPENSATED",
        "ROLLBACK_END",
        "SAGA_ABORTED",
    ]


def test_closure_compensation_is_marked_unrecoverable(wal: sp.WAL) -> None:
    undone: list[int] = []
    t = sp.tool(
        lambda x: x, name="closure", semantics=sp.COMPENSABLE, compensate=lambda r: lambda: undone.append(r)
    )
    with pytest.raises(sp.SagaAborted), sp.saga(wal=wal):
        t(3)
        raise RuntimeError
    commit = next(r for r in read_wal(wal.path) if r["event"] == "STEP_COMMITTED")
    assert commit["compensation"]["recoverable"] is False and commit["compensation"]["handler"] is None
    assert undone == [3]


def test_partial_rollback_to_step_n_leaves_earlier_steps_standing(wal: sp.WAL) -> None:
    with sp.saga(name="partial", wal=wal) as s:
        for amount in range(1, 6):
            charge(amount)
        report = s.rollback(to_step=2)
        assert report.clean and [st.index for st in report.compensated] == [5, 4, 3]
        assert [st.state for st in s.steps[:2]] == [sp.StepState.COMMITTED] * 2
        # Rolling back again over already-compensated steps is a no-op.
        again = s.rollback(to_step=2)
        assert again.compensated == [] and again.clean
        charge(6)
    assert [r["charge_id"] for r in REFUNDS] == ["ch_5", "ch_4", "ch_3"]
    assert s.status == "complete"
    ends = [r for r in read_wal(wal.path) if r["event"] == "ROLLBACK_END"]
    assert ends[0]["to_step"] == 2 and ends[0]["compensated"] == 3


def test_abort_after_partial_rollback_does_not_compensate_twice(wal: sp.WAL) -> None:
    with pytest.raises(sp.SagaAborted) as info, sp.saga(wal=wal) as s:
        charge(1)
        charge(2)
        s.rollback(to_step=1)
        raise RuntimeError("later failure")
    assert [r["charge_id"] for r in REFUNDS] == ["ch_2", "ch_1"]
    assert [st.index for st in info.value.report.compensated] == [1]


def test_decorator_forms(wal: sp.WAL) -> None:
    @sp.saga(wal=wal)
    def book(n: int) -> int:
        charge(n)
        return n * 2

    assert book(3) == 6 and book(4) == 8
    starts = [r for r in read_wal(wal.path) if r["event"] == "SAGA_START"]
    assert len(starts) == 2 and starts[0]["saga_id"] != starts[1]["saga_id"] and starts[0]["name"] == "book"


def test_irreversible_refused_without_confirmation(wal: sp.WAL) -> None:
    sent: list[str] = []
    email = sp.tool(lambda to: sent.append(to), name="send_email", semantics=sp.IRREVERSIBLE)
    with pytest.raises(sp.SagaAborted) as info, sp.saga(wal=wal):
        charge(9)
        email("ceo@example.com")
    assert sent == []
    assert isinstance(info.value.cause, sp.IrreversibleRefused)
    assert [r["charge_id"] for r in REFUNDS] == ["ch_9"]
    assert "STEP_REFUSED" in events(wal.path)


def test_irreversible_runs_with_confirmation_and_is_orphaned_on_rollback(wal: sp.WAL) -> None:
    seen: list[sp.ConfirmRequest] = []

    def confirm(req: sp.ConfirmRequest) -> bool:
        seen.append(req)
        return req.kwargs["to"].endswith("@example.com")

    email = sp.tool(lambda to: f"sent:{to}", name="send_email", semantics=sp.IRREVERSIBLE)
    with pytest.raises(sp.SagaAborted) as info, sp.saga(wal=wal, confirm=confirm):
        assert email("a@example.com") == "sent:a@example.com"
        raise RuntimeError
    assert seen[0].tool == "send_email" and seen[0].semantics is sp.IRREVERSIBLE
    report = info.value.report
    assert not report.clean and [s.tool for s in report.orphaned] == ["send_email"]


def test_capture_state_feeds_the_compensation(wal: sp.WAL) -> None:
    store = {"price": 10}

    def set_price(value: int) -> None:
        store["price"] = value

    t = sp.tool(
        set_price,
        semantics=sp.REVERSIBLE,
        capture_state=lambda value: dict(store),
        compensate=lambda _r, state: lambda: store.update(state),
    )
    with pytest.raises(sp.SagaAborted), sp.saga(wal=wal):
        t(99)
        assert store["price"] == 99
        raise RuntimeError
    assert store["price"] == 10
    intent = next(r for r in read_wal(wal.path) if r["event"] == "STEP_INTENT")
    assert intent["captured_state"] == {"price": 10}


def test_retries_are_bounded_and_a_transient_failure_recovers(wal: sp.WAL) -> None:
    tries: list[int] = []

    def flaky() -> None:
        tries.append(1)
        if len(tries) < 3:
            raise ConnectionError("flaky")

    t = sp.tool(
        lambda: 1, name="t", semantics=sp.COMPENSABLE, compensate=lambda _r: sp.Compensation(fn=flaky)
    )
    with pytest.raises(sp.SagaAborted) as info, sp.saga(wal=wal, max_attempts=3, retry_delay=0):
        t()
        raise RuntimeError
    assert len(tries) == 3 and info.value.report.clean
    comp = next(r for r in read_wal(wal.path) if r["event"] == "COMPENSATED")
    assert comp["attempts"] == 3


def test_effect_not_applied_needs_no_compensation(wal: sp.WAL) -> None:
    def decline(amount: int) -> None:
        raise sp.EffectNotApplied("card declined")

    t = sp.tool(
        decline, semantics=sp.COMPENSABLE, compensate=lambda r: sp.undo("test.refund", charge_id=r["id"])
    )
    with pytest.raises(sp.SagaAborted) as info, sp.saga(wal=wal):
        t(5)
    assert info.value.report.clean and [s.tool for s in info.value.report.skipped] == ["decline"]
    assert "STEP_FAILED" in events(wal.path)


def test_unknown_outcome_without_inverse_is_orphaned(wal: sp.WAL) -> None:
    def timeout(amount: int) -> None:
        raise TimeoutError("gateway timeout")

    # The factory needs a result, which a failed call does not have: the step may have landed.
    t = sp.tool(
        timeout, semantics=sp.COMPENSABLE, compensate=lambda r: sp.undo("test.refund", charge_id=r["id"])
    )
    with pytest.raises(sp.SagaAborted) as info, sp.saga(wal=wal):
        t(5)
    assert not info.value.report.clean and [s.tool for s in info.value.report.orphaned] == ["timeout"]
    assert "STEP_UNKNOWN" in events(wal.path)


def test_preview_is_never_compensated(wal: sp.WAL) -> None:
    peek = sp.tool(lambda: 42, name="peek", semantics=sp.PREVIEW)
    with pytest.raises(sp.SagaAborted) as info, sp.saga(wal=wal):
        peek()
        raise RuntimeError
    assert info.value.report.clean and [s.tool for s in info.value.report.skipped] == ["peek"]


def test_async_saga_and_concurrent_async_sagas(wal: sp.WAL) -> None:
    undone: list[str] = []

    @sp.compensator("test.async_undo")
    async def async_undo(name: str, idempotency_key: str) -> None:
        undone.append(name)

    async def reserve(name: str) -> str:
        await asyncio.sleep(0)
        return name

    t = sp.tool(reserve, semantics=sp.COMPENSABLE, compensate=lambda r: sp.undo("test.async_undo", name=r))

    async def one(i: int) -> None:
        async with sp.saga(name=f"a{i}", wal=wal):
            assert sp.current_saga() is not None
            await t(f"r{i}a")
            await t(f"r{i}b")
            if i % 2:
                raise RuntimeError("odd sagas fail")

    async def main() -> list[Any]:
        return await asyncio.gather(*(one(i) for i in range(8)), return_exceptions=True)

    results = asyncio.run(main())
    failures = [r for r in results if isinstance(r, sp.SagaAborted)]
    assert len(failures) == 4 and all(f.report.clean for f in failures)
    assert sorted(undone) == sorted(f"r{i}{x}" for i in (1, 3, 5, 7) for x in "ab")
    # Per saga, LIFO: b undone before a.
    for i in (1, 3, 5, 7):
        assert undone.index(f"r{i}b") < undone.index(f"r{i}a")
    recs = read_wal(wal.path)
    assert verify_chain(recs).intact
    assert sum(1 for r in recs if r["event"] == "SAGA_COMPLETE") == 4


def test_async_decorator(wal: sp.WAL) -> None:
    @sp.saga(name="adeco", wal=wal)
    async def work() -> str:
        return "done"

    assert asyncio.run(work()) == "done"
    assert events(wal.path) == ["SAGA_START", "SAGA_COMPLETE"]


def test_saga_object_runs_once(wal: sp.WAL) -> None:
    s = sp.Saga(wal=wal)
    with s:
        pass
    with pytest.raises(sp.SagaError), s:
        pass


def test_missing_handler_fails_that_compensation(wal: sp.WAL) -> None:
    t = sp.tool(
        lambda: 1, name="t", semantics=sp.COMPENSABLE, compensate=lambda _r: sp.undo("nobody.registered")
    )
    with pytest.raises(sp.SagaAborted) as info, sp.saga(wal=wal):
        t()
        raise RuntimeError
    assert [s.tool for s in info.value.report.failed] == ["t"]
