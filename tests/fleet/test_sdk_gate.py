"""The SDK's gate against a live control plane: a halt reaches an agent in another process through
its long-poll and stops `stripe.charge`, not `crm.insert`; budgets are enforced across calls;
every answer is in the WAL; an unreachable control plane is trusted for the grace, then refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest
import sagaplane as sp
from sagaplane.client import Client
from sagaplane.gate import Gate

from fleet import services
from tenants.actors import named_actor, user_actor
from tenants.models import Tenant
from tests.sdk.sagaplane_testkit import read_wal as read_records
from tests.support.scoping import in_tenant
from tests.support.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]

AGENT = textwrap.dedent(
    """
    import json, sys, time
    import sagaplane as sp
    from tests.support.waiting import wait_until

    sp.configure(sys.argv[1], agent="billing-bot", ship=False, gate=True)
    charge = sp.tool(lambda amount: amount, name="stripe.charge", semantics=sp.COMPENSABLE)
    insert = sp.tool(lambda row: row, name="crm.insert", semantics=sp.REVERSIBLE)

    def attempt(fn, arg):
        try:
            with sp.saga(name="probe"):
                fn(arg)
            return "allow"
        except sp.SagaAborted as aborted:  # the refusal aborts the saga (rolled back), as any error
            if isinstance(aborted.cause, sp.GateDenied):
                return aborted.cause.reason
            raise

    print(json.dumps({"ready": sp.status()["state"]}), flush=True)
    for line in sys.stdin:
        command = line.strip()
        if command == "until-halted":
            # Poll this agent's own view (no request: the long-poll thread keeps it current).
            started = time.monotonic()
            wait_until(lambda: attempt(charge, 1) == "halted", "the halt", deadline=30, every=0.01)
            print(json.dumps({"charge": attempt(charge, 1), "insert": attempt(insert, {"id": 1}),
                              "seconds": time.monotonic() - started}), flush=True)
        else:
            answer = {"charge": attempt(charge, 1), "insert": attempt(insert, {"id": 1})}
            print(json.dumps(answer), flush=True)
    """
)


pytestmark = pytest.mark.usefixtures("database_store")


@pytest.fixture
def gated(monkeypatch: pytest.MonkeyPatch, live_server: Any, alice: Any) -> str:
    monkeypatch.setenv("SAGAPLANE_URL", live_server.url)
    monkeypatch.setenv("SAGAPLANE_API_KEY", alice.api_key)
    return str(live_server.url)


def test_a_halt_reaches_an_agent_in_another_process_and_stops_only_its_tools(
    transactional_db: None, gated: str, alice: Any, tmp_path: Path
) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    agent = subprocess.Popen(
        [sys.executable, "-c", AGENT, str(tmp_path / "agent.wal")],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert agent.stdin is not None and agent.stdout is not None

        def ask(command: str) -> dict[str, Any]:
            agent.stdin.write(command + "\n")  # type: ignore[union-attr]
            agent.stdin.flush()  # type: ignore[union-attr]
            line = agent.stdout.readline()  # type: ignore[union-attr]
            assert line, agent.stderr.read()[-3000:]  # type: ignore[union-attr]
            return json.loads(line)

        assert json.loads(agent.stdout.readline()) == {"ready": "ready"}
        assert ask("try") == {"charge": "allow", "insert": "allow"}
        halt = in_tenant(
            services.halt,
            alice.tenant,
            services.HaltCreate.parse({"scope": "tool:stripe.*", "reason": "card incident"}),
            actor=user_actor("alice"),
        )
        seen = ask("until-halted")
        assert seen["charge"] == "halted" and seen["insert"] == "allow"
        print(f"halt reached the agent after {seen['seconds']:.3f} s")  # measured in bench/, not asserted
        in_tenant(services.resume, alice.tenant, halt.pk, actor=user_actor("alice"))

        # The resume reaches it the same way: poll the agent's view until charge is allowed again.
        def charge_allowed() -> dict[str, Any] | None:
            answer = ask("try")
            return answer if answer["charge"] == "allow" else None

        answer = wait_until(charge_allowed, "the resume to reach the agent", deadline=30)
        assert answer == {"charge": "allow", "insert": "allow"}
    finally:
        if agent.stdin is not None:
            agent.stdin.close()
        agent.wait(timeout=30)
    records = read_records(tmp_path / "agent.wal")
    denied = [r for r in records if r["event"] == "GATE_DENY"]
    assert denied and all(r["tool"] == "stripe.charge" and r["reason"] == "halted" for r in denied)


def test_a_budget_holds_an_agent_and_every_answer_is_in_its_wal(
    transactional_db: None, gated: str, alice: Any, tmp_path: Path
) -> None:
    tenant: Tenant = alice.tenant
    in_tenant(
        services.create_budget,
        tenant,
        services.BudgetCreate.parse(
            {"name": "daily", "tool": "stripe.*", "max_total": 100, "window_s": 86400}
        ),
        actor=named_actor("test"),
    )
    runtime = sp.configure(tmp_path / "b.wal", ship=False, agent="billing-bot")
    try:
        assert runtime.gate is not None
        runtime.gate.refresh()  # the budget was created after nothing: read the governed tools now
        charge = sp.tool(lambda amount: {"id": amount}, name="stripe.charge", semantics=sp.COMPENSABLE)
        with sp.saga(name="ok"):
            charge(60)
        with sp.saga(name="too much"), pytest.raises(sp.GateDenied) as denied:
            charge(50)  # refused before its effect; the saga itself goes on
        assert denied.value.reason == "budget_exceeded" and denied.value.answer["remaining"] == "40"
    finally:
        sp.shutdown()
    records = read_records(tmp_path / "b.wal")
    allow = next(r for r in records if r["event"] == "GATE_ALLOW")
    deny = next(r for r in records if r["event"] == "GATE_DENY")
    assert allow["tool"] == "stripe.charge" and len(allow["authorization_id"]) == 36
    assert deny["reason"] == "budget_exceeded" and deny["kwargs"] == {"amount": 50}
    # The allowed step ran after its authorisation; the denied one never wrote an intent.
    intents = [r for r in records if r["event"] == "STEP_INTENT"]
    assert [r["kwargs"] for r in intents] == [{"amount": 60}]
    assert records.index(allow) < records.index(intents[0])


def test_an_unreachable_control_plane_is_trusted_for_the_grace_then_refused(
    transactional_db: None, gated: str, alice: Any
) -> None:
    now = [1000.0]
    gate = Gate(gated, alice.api_key, grace=30, clock=lambda: now[0])
    gate.refresh()
    assert gate.status()["state"] == "ready"
    # The control plane goes away: both clients now point at a closed port.
    gate._ask = Client("http://127.0.0.1:1", alice.api_key, timeout=2)
    gate._poll = Client("http://127.0.0.1:1", alice.api_key, timeout=2)
    gate.refresh()
    call = sp.gate.Call("s", "1", "crm.insert", "reversible", {})
    now[0] += 29
    assert gate.check(call) is None and gate.status()["ready"] is True
    now[0] += 2
    with pytest.raises(sp.GateDenied) as denied:
        gate.check(call)
    assert denied.value.reason == "control_plane_unreachable"
    assert gate.status() == {"ready": False, "state": "unknown", "halts": [], "state_age_s": 31.0}


def test_a_control_plane_whose_store_is_down_is_a_denial_with_its_reason_in_the_wal(
    transactional_db: None, gated: str, alice: Any, tmp_path: Path
) -> None:
    """The server's 503 `control_plane_unavailable` (its database unreachable: here marked so,
    its probe failing until the test lets it answer) is the agent's `GateDenied` with that
    reason, recorded as GATE_DENY; the step never ran. Once the store answers, the call is allowed."""
    from core import availability

    in_tenant(
        services.create_budget,
        alice.tenant,
        services.BudgetCreate.parse(
            {"name": "daily", "tool": "stripe.*", "max_total": 100, "window_s": 86400}
        ),
        actor=named_actor("test"),
    )
    answering = threading.Event()

    def probe() -> None:
        if not answering.is_set():
            raise ConnectionRefusedError("the database is down (test)")

    runtime = sp.configure(tmp_path / "u.wal", ship=False, agent="billing-bot")
    try:
        assert runtime.gate is not None
        runtime.gate.refresh()
        charge = sp.tool(lambda amount: {"id": amount}, name="stripe.charge", semantics=sp.COMPENSABLE)
        availability.mark(availability.DATABASE, probe=probe)
        with sp.saga(name="store down"), pytest.raises(sp.GateDenied) as denied:
            charge(5)
        assert denied.value.reason == "control_plane_unavailable"
        assert denied.value.answer["decision"] == "deny" and denied.value.answer["retry_after"] == 1
        answering.set()
        wait_until(
            lambda: not availability.is_down(availability.DATABASE),
            "the probe to mark the database up",
            deadline=30,
            every=0.01,
        )
        with sp.saga(name="store back"):
            charge(5)
    finally:
        sp.shutdown()
    records = read_records(tmp_path / "u.wal")
    (deny,) = [r for r in records if r["event"] == "GATE_DENY"]
    assert deny["reason"] == "control_plane_unavailable" and deny["kwargs"] == {"amount": 5}
    assert len([r for r in records if r["event"] == "GATE_ALLOW"]) == 1
    assert len([r for r in records if r["event"] == "STEP_INTENT"]) == 1  # only the allowed one ran


def test_a_state_never_read_refuses(alice: Any) -> None:
    gate = Gate("http://127.0.0.1:1", "sp_x_y", grace=30)
    with pytest.raises(sp.GateDenied) as denied:
        gate.check(sp.gate.Call("s", "1", "crm.insert", "reversible", {}))
    assert denied.value.reason == "control_plane_unreachable"


def test_guarantees_say_what_is_and_is_not_enforced() -> None:
    statement = sp.guarantees()
    assert statement["version"] and statement["grace_s_default"] == 30
    assert any("outside a saga" in line for line in statement["not_claimed"])
    assert json.loads(json.dumps(statement)) == statement


def test_status_after_shutdown_is_not_ready_until_configured_again(tmp_path: Path) -> None:
    """No live server here: a gate's long-poll still open at the server when the test's database
    is flushed can deadlock the flush. The state after shutdown does not depend on the gate."""
    sp.configure(tmp_path / "s.wal", ship=False, gate=False)
    try:
        assert sp.status()["ready"] is True and sp.status()["state"] == "ungated"
    finally:
        sp.shutdown()
    # Said `ready` / `ungated` before: the WAL, the shipper and the gate are closed.
    assert sp.status() == {"ready": False, "state": "shut_down", "halts": [], "state_age_s": None}
    sp.configure(tmp_path / "s.wal", ship=False, gate=False)
    try:
        assert sp.status()["state"] == "ungated"  # configured again
    finally:
        sp.shutdown()
    assert sp.status()["state"] == "shut_down"
