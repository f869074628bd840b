"""Recovery with real processes killed for real: agents SIGKILLed after charging, recovery workers
SIGKILLed (or SIGSTOPped and resumed) mid-compensation, the Postgres server restarted during
recovery. Everything runs against a deployment of the test's own (tests/recovery/live.py); the
shop's ledger counts refund attempts separately from the refunds applied."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from recovery.webhook import signed_headers
from tests.recovery.live import Deployment, committed, deployment, records
from tests.support.processes import stop_group

pytestmark = [pytest.mark.postgres, pytest.mark.redis]

LEASE_TTL = 2.0  # the agents' saga lease


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    with deployment(tmp_path_factory.mktemp("recovery-live")) as running:
        yield running


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
        assert len(chained(live, "once", "COMPENSATED", 1)) == 1
        assert (live.saga("once") or {})["saga"]["status"] == "rolled_back"
    finally:
        stop_group(worker)


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
            compensated = chained(live, saga_id, "COMPENSATED", 2)
            assert len(compensated) == 2 and len({r["step_id"] for r in compensated}) == 2
            assert not {r["worker"] for r in compensated} & {"w-doomed", "w-frozen"}
            assert {j["state"] for j in live.jobs(saga_id)} == {"compensated"}
    finally:
        for process in (doomed, frozen, fast):
            if process is not None:
                stop_group(process)


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
        stop_group(worker)


def chained(live: Deployment, saga_id: str, event: str, count: int) -> list[dict[str, Any]]:
    """The saga's server records of `event`, once there are at least `count`. A finished job's
    records are accepted with its result but chained after the commit (group commit), or by the
    sweep if that attempt fails, so a reader that looks at once may be early; one more than
    `count` is still seen by the caller's assertion."""

    def enough() -> list[dict[str, Any]] | None:
        found = records(live, saga_id, event)
        return found if len(found) >= count else None

    found: list[dict[str, Any]] = live.until(enough, f"{count} {event} records of {saga_id} to be chained")
    return found


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
            assert len(chained(live, saga_id, "COMPENSATED", 3)) == 3
            assert len(chained(live, saga_id, "ROLLBACK_END", 1)) == 1
        assert set(live.refunds().values()) == {1}
    finally:
        stop_group(worker)


# ------------------------------------------------------------------------------------- webhook

DOCS = Path(__file__).resolve().parents[2] / "docs" / "ARCHITECTURE.md"


def documented_verifier() -> Callable[[str, bytes, str], bool]:
    """Exactly the receiver's snippet from docs/ARCHITECTURE.md (§8.8), executed as written."""
    text = DOCS.read_text()
    after = text.split("<!-- recovery-webhook-verify -->", 1)[1]
    code = after.split("```python\n", 1)[1].split("```", 1)[0]
    namespace: dict[str, Any] = {}
    exec(compile(code, str(DOCS), "exec"), namespace)  # noqa: S102 (our own documentation)
    verify: Callable[[str, bytes, Any], bool] = namespace["verify_signature"]
    return verify


class Receiver(ThreadingHTTPServer):
    """The tenant's refund endpoint: answers 500 to the first delivery, then applies each
    idempotency key once; every delivery's signature is checked with the documented snippet."""

    def __init__(self, secret: list[str]) -> None:
        super().__init__(("127.0.0.1", 0), _ReceiverHandler)
        self.secret = secret
        self.verify = documented_verifier()
        self.deliveries: list[dict[str, Any]] = []
        self.checks: list[dict[str, Any]] = []  # reconciliation's, once the refund is recorded
        self.applied: dict[str, str] = {}  # idempotency key → charge id


class _ReceiverHandler(BaseHTTPRequestHandler):
    server: Receiver

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        delivery = {
            "body": body,
            "headers": dict(self.headers.items()),
            "idempotency_key": self.headers.get("Idempotency-Key", ""),
            "verified": self.server.verify(self.server.secret[0], body, self.headers),
        }
        if json.loads(body).get("type") == "reconciliation.check":
            # The same webhook observes the refund (a reconciliation check, signed the same way)
            # when the test runs slowly enough for the pass to offer it: noted, not a delivery.
            self.server.checks.append(delivery)
            status = 200 if delivery["verified"] else 401
        else:
            self.server.deliveries.append(delivery)
            if not delivery["verified"]:
                status = 401
            elif len(self.server.deliveries) == 1:
                status = 500  # the first one fails
            else:
                job = json.loads(body)
                self.server.applied.setdefault(delivery["idempotency_key"], job["kwargs"]["charge_id"])
                status = 200
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def test_a_webhook_answering_500_then_200_refunds_once(live: Deployment) -> None:
    secret: list[str] = []
    receiver = Receiver(secret)
    thread = threading.Thread(target=receiver.serve_forever, daemon=True)
    thread.start()
    try:
        with live.client() as client:
            answer = client.put(
                "/api/v1/recovery/webhook",
                json={
                    "url": f"http://127.0.0.1:{receiver.server_port}/refund",
                    "handlers": ["shop.refund_by_hook"],
                },
            )
            assert answer.status_code == 200, answer.text
            secret.append(answer.json()["secret"])
        agent = live.agent("hang", "hooked", "1", str(LEASE_TTL), SHOP_REFUND_HANDLER="shop.refund_by_hook")
        live.until(lambda: committed(live, "hooked", 1), "hooked's commit to be shipped")
        os.killpg(agent.pid, signal.SIGKILL)
        agent.wait(timeout=30)
        live.until(lambda: receiver.applied, "the webhook to apply the refund")
        live.until(lambda: records(live, "hooked", "COMPENSATED"), "the refund to be recorded")
        live.sweep_times(3)
        assert list(receiver.applied.values()) == ["hooked-ch1"]
        assert len(receiver.deliveries) == 2 and all(d["verified"] for d in receiver.deliveries)
        assert all(check["verified"] for check in receiver.checks)
        keys = {d["idempotency_key"] for d in receiver.deliveries}
        (compensated,) = records(live, "hooked", "COMPENSATED")
        assert keys == {compensated["idempotency_key"]} and compensated["delivery"] == "webhook"
        (failed,) = records(live, "hooked", "COMPENSATION_FAILED")
        assert failed["error"] == "webhook answered HTTP 500" and failed["final"] is False
        assert "hooked-ch1" not in live.refunds()  # no SDK worker ran it
        # Both attempts carry the same webhook-id (the standard's idempotency key).
        assert len({d["headers"]["webhook-id"] for d in receiver.deliveries}) == 1
        # Forgeries fail the documented check: another secret, another body, an old signature.
        verify, good = receiver.verify, receiver.deliveries[-1]
        headers = {name.lower(): value for name, value in good["headers"].items()}
        assert verify(secret[0], good["body"], headers)
        assert not verify("whsec_Zm9yZ2Vk", good["body"], headers)
        assert not verify(secret[0], good["body"].replace(b"hooked", b"hacked"), headers)
        key = good["idempotency_key"]
        stale = signed_headers(
            secret[0], good["body"], idempotency_key=key, timestamp=int(time.time()) - 3600
        )
        assert not verify(secret[0], good["body"], stale)
        assert not verify(secret[0], good["body"], {**headers, "webhook-timestamp": "abc"})
    finally:
        receiver.shutdown()
        with live.client() as client:
            client.delete("/api/v1/recovery/webhook")


# -------------------------------------------------------------------------------- agent-saga

AGENT_SAGA = """
import asyncio, sys, threading
from agent_saga import compensator, saga_scope, tool
from agent_saga.semantics import ActionSemantics as S, Compensation
from agent_saga.wal import FileWAL

@compensator("shop.refund")
def refund(charge_id, idempotency_key=None):
    pass

@tool(semantics=S.COMPENSABLE, compensate=lambda r: Compensation(
    fn=refund, kwargs={"charge_id": r["id"]}, handler="shop.refund", description="refund"))
async def charge(amount):
    return {"id": "as-ch1"}

async def main():
    wal = FileWAL(sys.argv[1])
    await wal.start()
    async with saga_scope(name="agent-saga-checkout", wal=wal):
        await charge(amount=42)
        await wal.flush() if hasattr(wal, "flush") else None
        print("charged", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, threading.Event().wait)

asyncio.run(main())
"""


def test_an_agent_saga_crash_log_shipped_from_elsewhere_is_recovered(
    live: Deployment, tmp_path: Path
) -> None:
    """agent-saga writes intent and commit, is killed before any terminal record; its WAL is
    copied to another folder (another machine) and shipped by `sagaplane ship`; a Sagaplane
    worker refunds the charge."""
    script = tmp_path / "agent_saga_agent.py"
    script.write_text(AGENT_SAGA)
    wal = tmp_path / "agent-saga.wal"
    agent = live.start([sys.executable, str(script), str(wal)], "agent-saga.log")
    live.until(lambda: wal.exists() and "STEP_COMMITTED" in wal.read_text(), "agent-saga's commit in its WAL")
    os.killpg(agent.pid, signal.SIGKILL)
    agent.wait(timeout=30)
    lines = [json.loads(line) for line in wal.read_text().splitlines() if line.strip()]
    assert [r["event"] for r in lines][-1] == "STEP_COMMITTED"  # a crash log: no terminal record
    saga_id = lines[0]["saga_id"]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shutil.copy(wal, elsewhere / "shipped.wal")
    shipped = subprocess.run(
        [sys.executable, "-m", "sagaplane", "ship", str(elsewhere / "shipped.wal"), "--no-progress"],
        env=live.sdk_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shipped.returncode == 0, shipped.stdout + shipped.stderr
    worker = live.worker("w-agent-saga")
    try:
        live.until(lambda: live.refunds().get("as-ch1") == 1, "the agent-saga charge's refund")
        (job,) = live.jobs(saga_id)
        assert job["state"] == "compensated" and job["handler"] == "shop.refund"
        (refund,) = [r for r in live.ledger_rows("refunds") if r["charge_id"] == "as-ch1"]
        assert refund["idempotency_key"] == lines[-1]["compensation"]["idempotency_key"]
        live.until(
            lambda: (live.saga(saga_id) or {})["saga"]["status"] == "rolled_back", "the saga rolled back"
        )
    finally:
        stop_group(worker)
