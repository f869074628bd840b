"""The SDK waits for a human: an agent in another process blocked on the gate resumes after the
deciding vote and runs its IRREVERSIBLE wire exactly once (no local confirm= needed); a denial
refuses; the control plane going away while it waits refuses."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import sagaplane as sp
from sagaplane.gate import Call, Gate

from approvals.models import ApprovalRequest, Status
from core.scoping import tenant_context
from fleet.models import Decision, GateDecision
from tests.sdk.sagaplane_testkit import read_wal
from tests.support.approvals import Agent, vote, wire_policy
from tests.support.factories import Person
from tests.support.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
# Postgres: the agent's long-poll and the test's vote run at once, which SQLite's in-memory test
# database (one connection shared by the live server's threads) cannot serve.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]

AGENT = textwrap.dedent(
    """
    import json, sys
    import sagaplane as sp

    sp.configure(sys.argv[1], agent="payments-bot", ship=False, gate=True)
    effects = []

    def wire(amount, to):
        effects.append(amount)
        print(json.dumps({"effect": amount}), flush=True)
        return {"ok": True}

    wire_tool = sp.tool(wire, name="bank.wire", semantics=sp.IRREVERSIBLE)
    try:
        with sp.saga(name="payout"):
            wire_tool(int(sys.argv[2]), "supplier@acme.example")
        print(json.dumps({"done": len(effects)}), flush=True)
    except sp.SagaAborted as aborted:
        print(json.dumps({"refused": getattr(aborted.cause, "reason", repr(aborted.cause))}), flush=True)
    except sp.GateDenied as denied:
        print(json.dumps({"refused": denied.reason}), flush=True)
    sp.shutdown()
    """
)


def _start(
    live_server: Any, agent: Agent, wal: Path, amount: int
) -> tuple[subprocess.Popen[str], queue.Queue[str]]:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "SAGAPLANE_URL": live_server.url,
        "SAGAPLANE_API_KEY": agent.raw_key,
    }
    process = subprocess.Popen(
        [sys.executable, "-c", AGENT, str(wal), str(amount)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.put(line)

    threading.Thread(target=read, daemon=True).start()
    return process, lines


def _pending(agent: Agent, deadline_s: float = 60) -> ApprovalRequest:
    def pending() -> ApprovalRequest | None:
        with tenant_context(agent.tenant):
            return ApprovalRequest.objects.filter(status=Status.PENDING).first()

    return wait_until(pending, "the agent to ask for an approval", deadline=deadline_s)


def _line(lines: queue.Queue[str], process: subprocess.Popen[str], timeout: float = 60) -> dict[str, Any]:
    try:
        return json.loads(lines.get(timeout=timeout))
    except queue.Empty:
        process.kill()
        assert process.stderr is not None
        raise AssertionError("no answer from the agent:\n" + process.stderr.read()[-3000:]) from None


def test_an_agent_blocked_on_the_gate_resumes_after_the_vote_and_runs_once(
    live_server: Any, agent: Agent, ann: Person, tmp_path: Path
) -> None:
    wire_policy(agent.tenant, eligible_roles=["approver"])
    process, lines = _start(live_server, agent, tmp_path / "agent.wal", 5000)
    try:
        row = _pending(agent)
        assert lines.empty() and process.poll() is None  # waiting, nothing done
        voted = time.monotonic()
        vote(ann, row.pk)
        assert _line(lines, process) == {"effect": 5000}
        print(f"resumed {time.monotonic() - voted:.3f} s after the vote")  # measured in bench/
        assert _line(lines, process) == {"done": 1}
        assert process.wait(timeout=60) == 0
    finally:
        if process.poll() is None:
            process.kill()
    with tenant_context(agent.tenant):
        allows = list(GateDecision.objects.filter(decision=Decision.ALLOW))
        row.refresh_from_db()
    assert len(allows) == 1 and row.status == Status.CONSUMED and row.authorization_id == str(allows[0].pk)
    records = read_wal(tmp_path / "agent.wal")
    allow = next(r for r in records if r["event"] == "GATE_ALLOW")
    assert allow["approvals"] == [row.pk] and allow["authorization_id"] == str(allows[0].pk)
    assert [r["kwargs"]["amount"] for r in records if r["event"] == "STEP_INTENT"] == [5000]


def test_a_denial_reaches_the_waiting_agent_and_nothing_runs(
    live_server: Any, agent: Agent, ann: Person, tmp_path: Path
) -> None:
    wire_policy(agent.tenant)
    process, lines = _start(live_server, agent, tmp_path / "agent.wal", 7000)
    try:
        row = _pending(agent)
        vote(ann, row.pk, "deny", "unknown supplier")
        assert _line(lines, process) == {"refused": "approval_denied"}
        assert process.wait(timeout=60) == 0
    finally:
        if process.poll() is None:
            process.kill()
    assert not any(r["event"] == "STEP_INTENT" for r in read_wal(tmp_path / "agent.wal"))


def test_an_unreachable_control_plane_while_waiting_refuses(live_server: Any, agent: Agent) -> None:
    wire_policy(agent.tenant)
    gate = Gate(live_server.url, agent.raw_key, approval_wait=1.0).start()
    try:
        call = Call("s-down", "1", "bank.wire", "IRREVERSIBLE", {"amount": 900})
        answer = gate._evaluate(
            {
                "saga_id": call.saga_id,
                "step_id": call.step_id,
                "tool": call.tool,
                "semantics": call.semantics,
                "args": call.args,
            }
        )
        assert answer["decision"] == "pending_approval"
        # The same answer, but the control plane it names is gone (a port nobody listens on).
        gate._wait = sp.Client("http://127.0.0.1:9", agent.raw_key, timeout=2.0)
        started = time.monotonic()
        with pytest.raises(sp.GateDenied) as denied:
            gate._await_approval(answer)
        assert denied.value.reason == "control_plane_unreachable"
        assert time.monotonic() - started < answer["expires_in"]
    finally:
        gate.close()


def test_the_control_plane_killed_while_an_agent_waits_refuses(agent: Agent, tmp_path: Path) -> None:
    """The control plane is a real server process, SIGKILLed while the agent's long-poll is open."""
    import urllib.parse

    from django.conf import settings
    from django.db import connection

    wire_policy(agent.tenant)
    db = connection.settings_dict
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_OWNER_URL", "PYTEST_CURRENT_TEST")}
    env["DJANGO_SETTINGS_MODULE"] = "controlplane.settings"
    env["DATABASE_URL"] = (
        f"postgres://{urllib.parse.quote(db['USER'] or '')}:{urllib.parse.quote(db['PASSWORD'] or '')}"
        f"@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"
    )
    env["SAGAPLANE_DATA_DIR"] = str(settings.DATA_DIR)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    server = _Server(env)
    gate = Gate(server.url, agent.raw_key, approval_wait=20.0)
    outcome: list[BaseException | None] = []
    try:
        body = {"saga_id": "s-killed", "step_id": "1", "tool": "bank.wire", "args": {"amount": 900}}
        answer = gate._evaluate(body)
        assert answer["decision"] == "pending_approval"

        def wait() -> None:
            try:
                gate._await_approval(answer)
                outcome.append(None)
            except BaseException as exc:  # the outcome is asserted below
                outcome.append(exc)

        waiter = threading.Thread(target=wait, daemon=True)
        waiter.start()
        waiter.join(timeout=1.0)  # the agent is blocked in its long-poll (bounded look, not a sync)
        assert waiter.is_alive() and not outcome
        server.kill()
        waiter.join(timeout=30)
        assert not waiter.is_alive()
        assert isinstance(outcome[0], sp.GateDenied) and outcome[0].reason == "control_plane_unreachable"
    finally:
        gate.close()
        if server.proc is not None:
            server.kill()


class _Server:
    """`uvicorn controlplane.asgi:application` as a child process, ready once it listens."""

    def __init__(self, env: dict[str, str]) -> None:
        import signal
        import socket

        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        self._signal = signal.SIGKILL
        self.proc: subprocess.Popen[str] | None = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "uvicorn",
                "controlplane.asgi:application",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--lifespan",
                "off",
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        log: list[str] = []
        ready = threading.Event()

        def drain() -> None:
            assert self.proc is not None and self.proc.stderr is not None
            for line in self.proc.stderr:
                log.append(line)
                if "Uvicorn running on" in line:
                    ready.set()
            ready.set()

        threading.Thread(target=drain, daemon=True).start()
        assert ready.wait(120) and self.proc.poll() is None, "".join(log[-30:])

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(self._signal)
        self.proc.wait(30)
        self.proc = None
