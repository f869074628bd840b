"""Recovery with real processes killed for real: agents SIGKILLed after charging, recovery workers
SIGKILLed (or SIGSTOPped and resumed) mid-compensation, the Postgres server restarted during
recovery. Everything runs against a deployment of the test's own (tests/recovery/live.py); the
shop's ledger counts refund attempts separately from the refunds applied."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest

from tests.recovery.live import Deployment, deployment, stop

pytestmark = [pytest.mark.postgres, pytest.mark.redis]

LEASE_TTL = 2.0  # the agents' saga lease


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    with deployment(tmp_path_factory.mktemp("recovery-live")) as running:
        yield running


def records(live: Deployment, saga_id: str, event: str) -> list[dict[str, Any]]:
    saga = live.saga(saga_id) or {"records": []}
    return [r["record"] for r in saga["records"] if r["stream"] == "server" and r["record"]["event"] == event]


def committed(live: Deployment, saga_id: str, steps: int) -> bool:
    saga = live.saga(saga_id)
    return saga is not None and [s["status"] for s in saga["steps"]] == ["committed"] * steps


def killed_after_charges(live: Deployment, saga_id: str, charges: int) -> float:
    """Start an agent that charges and hangs; SIGKILL it once the control plane holds its
    commits. Returns when it was killed (time.time())."""
    agent = live.agent("hang", saga_id, str(charges), str(LEASE_TTL))
    live.until(lambda: committed(live, saga_id, charges), f"{saga_id}'s commits to be shipped")
    os.killpg(agent.pid, signal.SIGKILL)
    agent.wait(timeout=30)
    return time.time()


def _when(value: str) -> float:
    return datetime.fromisoformat(value).timestamp()


def test_an_agent_killed_after_a_charge_is_refunded_once(live: Deployment) -> None:
    worker = live.worker("w-once")
    try:
        killed_at = killed_after_charges(live, "once", 1)
        live.until(lambda: live.refunds().get("once-ch1") == 1, "the refund", deadline=LEASE_TTL + 30)
        refunded_at = max(r["at"] for r in live.ledger_rows("refunds") if r["charge_id"] == "once-ch1")
        # Within the lease and two seconds (of the sweep's tick, the claim, the handler) of the kill,
        # measured on one clock (this machine's); the server's own view follows.
        saga = live.saga("once") or {"records": []}
        timeline = [(r["record"]["event"], r["record"]["ts"]) for r in saga["records"]]
        assert refunded_at - killed_at <= LEASE_TTL + 2.0, (killed_at, refunded_at, timeline)
        (job,) = live.jobs("once")
        assert job["state"] == "compensated" and job["attempts"] == 1
        live.sweep_times(10)
        assert live.refunds().get("once-ch1") == 1 and live.attempts().get("once-ch1") == 1
        assert len(records(live, "once", "COMPENSATED")) == 1
        assert (live.saga("once") or {})["saga"]["status"] == "rolled_back"
    finally:
        stop(worker)


def test_racing_workers_one_killed_one_resumed_refund_each_charge_once(live: Deployment) -> None:
    sagas = [f"race{n}" for n in range(3)]
    for saga_id in sagas:
        killed_after_charges(live, saga_id, 2)
    charges = [f"{s}-ch{n}" for s in sagas for n in (1, 2)]
    # Two workers race for the jobs; the slow one is SIGKILLed in the middle of a refund, and a
    # third is stopped (SIGSTOP) in the middle of one and resumed after its lease ran out.
    doomed = live.worker("w-doomed", SHOP_REFUND_SLEEP="30")
    frozen = live.worker("w-frozen", SHOP_REFUND_SLEEP="5")
    fast = None
    try:
        pids = {doomed.pid: "doomed", frozen.pid: "frozen"}

        def started(name: str) -> str | None:
            rows = [r for r in live.ledger_rows("attempts") if pids.get(r["pid"]) == name]
            return rows[0]["charge_id"] if rows else None

        doomed_charge = live.until(lambda: started("doomed"), "the doomed worker to start a refund")
        os.killpg(doomed.pid, signal.SIGKILL)
        frozen_charge = live.until(lambda: started("frozen"), "the frozen worker to start a refund")
        os.killpg(frozen.pid, signal.SIGSTOP)
        fast = live.worker("w-fast")
        live.until(
            lambda: all(live.refunds().get(c) == 1 for c in charges),
            "every charge to be refunded",
            deadline=90,
        )
        os.killpg(frozen.pid, signal.SIGCONT)  # resumed, with its old token
        live.until(
            lambda: "claimed again after this worker's lease ran out" in live.log("worker-w-frozen.log"),
            "the resumed worker to be refused",
        )
        live.sweep_times(3)
        refunds, attempts = live.refunds(), live.attempts()
        assert {c: refunds.get(c) for c in charges} == dict.fromkeys(charges, 1)
        assert (
            attempts[doomed_charge] >= 2 and attempts[frozen_charge] >= 2
        )  # run again after each lease ran out
        for saga_id in sagas:
            compensated = records(live, saga_id, "COMPENSATED")
            assert len(compensated) == 2 and len({r["step_id"] for r in compensated}) == 2
            assert not {r["worker"] for r in compensated} & {"w-doomed", "w-frozen"}
            assert {j["state"] for j in live.jobs(saga_id)} == {"compensated"}
    finally:
        for process in (doomed, frozen, fast):
            if process is not None:
                stop(process)


def test_an_agent_killed_mid_rollback_is_finished_newest_first(live: Deployment) -> None:
    agent = live.agent("rollback", "midway", "3", str(LEASE_TTL), SHOP_BLOCK_AFTER_REFUNDS="1")
    live.until(
        lambda: len(records_any(live, "midway", "COMPENSATED")) == 1, "the agent's first refund to ship"
    )
    os.killpg(agent.pid, signal.SIGKILL)
    agent.wait(timeout=30)
    assert live.refunds().get("midway-ch3") == 1 and "midway-ch2" not in live.refunds()
    worker = live.worker("w-midway")
    try:
        live.until(
            lambda: all(live.refunds().get(f"midway-ch{n}") == 1 for n in (1, 2, 3)),
            "the rest of the rollback",
        )
        order = [r["charge_id"] for r in live.ledger_rows("refunds") if r["charge_id"].startswith("midway-")]
        assert order == ["midway-ch3", "midway-ch2", "midway-ch1"]
        assert {c: live.attempts()[c] for c in order} == dict.fromkeys(order, 1)
        jobs = live.jobs("midway")
        assert sorted(j["step"] for j in jobs) == [1, 2]  # the agent's own refund is not redone
        live.until(
            lambda: (live.saga("midway") or {})["saga"]["status"] == "rolled_back",
            "the saga to be rolled back",
        )
    finally:
        stop(worker)


def records_any(live: Deployment, saga_id: str, event: str) -> list[dict[str, Any]]:
    saga = live.saga(saga_id) or {"records": []}
    return [r["record"] for r in saga["records"] if r["record"]["event"] == event]


def test_postgres_restarted_during_recovery(live: Deployment) -> None:
    sagas = [f"pg{n}" for n in range(4)]
    for saga_id in sagas:
        killed_after_charges(live, saga_id, 3)
    charges = [f"{s}-ch{n}" for s in sagas for n in (1, 2, 3)]
    worker = live.worker("w-pg", SHOP_REFUND_SLEEP="0.3")
    try:
        live.until(lambda: len(live.refunds()) >= 3, "some refunds before the restart")
        live.cluster.restart()
        live.until(
            lambda: all(live.refunds().get(c) == 1 for c in charges),
            "every refund after the restart",
            deadline=120,
        )

        def finished(saga_id: str) -> bool:
            return {j["state"] for j in live.jobs(saga_id)} == {"compensated"}

        for saga_id in sagas:
            live.until(lambda: finished(saga_id), f"{saga_id}'s jobs to be finished")  # noqa: B023 (awaited here)
            assert len(records(live, saga_id, "COMPENSATED")) == 3
            assert len(records(live, saga_id, "ROLLBACK_END")) == 1
        assert set(live.refunds().values()) == {1}
    finally:
        stop(worker)
