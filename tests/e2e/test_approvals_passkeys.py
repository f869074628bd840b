"""Approvals with passkeys in a real browser against a real server, with Chrome's virtual
authenticator (CDP WebAuthn: CTAP2, internal, resident keys, user verification): a member
registers a passkey and signs in with it; an agent process blocks on a pending wire; the queue
shows it live; two approvers approve it with their passkeys (2-of-2); the agent resumes and the
wire runs exactly once; the saga's disclosure proves who approved what (`sagaplane
verify-approval`, offline).

WebAuthn needs a relying party id that is a domain, so the browser reaches the server as
http://localhost:<port> (the RP id is localhost), not 127.0.0.1."""

from __future__ import annotations

import json
import os
import re
import select
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import expect

from tests.e2e.browser import (
    LIVE_TIMEOUT,
    OWNER,
    PASSWORD,
    RISK,
    ROOT,
    LiveServer,
    localhost,
    passkey_browser,
    register_passkey,
    screenshot,
    sign_in,
)
from tests.support.waiting import wait_until

pytestmark = pytest.mark.e2e
AGENT_DEADLINE = 60.0

AGENT = textwrap.dedent(
    """
    import json, pathlib, sys
    import sagaplane as sp

    wal, effects, saga_id = sys.argv[1], pathlib.Path(sys.argv[2]), sys.argv[3]
    sp.configure(wal, agent="payments-bot", ship=True, gate=True)

    def wire(amount, to, currency):
        with effects.open("a") as out:  # the effect: one line per wire sent
            out.write(json.dumps({"amount": amount, "to": to, "currency": currency}) + "\\n")
        return {"sent": amount}

    # Governed by an approval policy: the humans in the dashboard confirm it, not a local hook.
    bank_wire = sp.tool(wire, name="bank.wire", semantics=sp.IRREVERSIBLE, confirm=lambda request: True)
    print(json.dumps({"ready": True}), flush=True)
    try:
        with sp.saga(name="payout", saga_id=saga_id):
            bank_wire(amount=250000, to="ACME GmbH", currency="EUR")
        print(json.dumps({"result": "ran"}), flush=True)
    except sp.SagaAborted as aborted:
        reason = str(getattr(aborted.cause, "reason", aborted.cause))
        print(json.dumps({"result": "refused", "reason": reason}), flush=True)
    sp.shutdown()  # ships the WAL's tail: the saga's end reaches the control plane
    """
)


def test_two_approvers_approve_a_wire_with_passkeys_and_the_agent_runs_it_once(
    browser_instance: Any, control_plane: LiveServer, tmp_path: Path
) -> None:
    owner_context, owner = passkey_browser(browser_instance, control_plane)
    risk_context, risk = passkey_browser(browser_instance, control_plane)
    agent = None
    try:
        # The owner registers a passkey, signs out, and signs in with it (no password typed).
        sign_in(owner, OWNER)
        register_passkey(owner, "Owner laptop")
        owner.get_by_role("button", name="Sign out").click()
        owner.goto("/login/?next=/approvals/")
        owner.get_by_role("button", name="Sign in with a passkey").click()
        expect(owner.get_by_role("button", name="Sign out")).to_be_visible()
        expect(owner).to_have_url(f"{localhost(control_plane)}/approvals/")
        sign_in(risk, RISK, PASSWORD)
        register_passkey(risk, "Risk phone")

        # Wires above 10,000 need two approvals, by passkey only: set on the policies page.
        owner.goto("/approvals/policies/")
        form = owner.locator("#policy-form")
        form.get_by_label("Name", exact=True).fill("large wires")
        form.get_by_label("Tools (glob)").fill("bank.*")
        form.get_by_label("Argument of condition 1").fill("amount")
        form.get_by_label("Operator of condition 1").select_option(label="is more than")
        form.get_by_label("Value of condition 1").fill("10000")
        form.get_by_label("Approvals required").fill("2")
        form.get_by_label("Passkey votes only").check()
        form.get_by_role("button", name="Create policy").click()
        expect(owner.get_by_text("Approval policy 'large wires' created.")).to_be_visible()
        expect(owner.locator('#policies-table tr[data-policy="large wires"]')).to_contain_text("passkey only")

        owner.goto("/approvals/")
        expect(owner.locator("html")).to_have_attribute("data-live", "open", timeout=LIVE_TIMEOUT)
        expect(owner.locator("#approval-queue-empty")).to_be_visible()
        owner.evaluate("window.__noReload = true")

        # The agent asks the gate for the wire and blocks, waiting for the humans.
        saga_id = f"e2e-payout-{uuid.uuid4().hex[:8]}"
        effects = tmp_path / "wires.ndjson"
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "SAGAPLANE_URL": control_plane.url,
            "SAGAPLANE_API_KEY": control_plane.api_key,
        }
        agent = subprocess.Popen(
            [sys.executable, "-c", AGENT, str(tmp_path / "agent.wal"), str(effects), saga_id],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert agent.stdout is not None
        assert json.loads(agent.stdout.readline()) == {"ready": True}

        # It appears in the open queue without a reload.
        row = owner.locator('#approval-queue tr[data-tool="bank.wire"]')
        expect(row).to_be_visible(timeout=LIVE_TIMEOUT)
        expect(row).to_contain_text("250,000 EUR")
        expect(row).to_contain_text("0 of 2")
        assert owner.evaluate("window.__noReload") is True
        assert agent.poll() is None and not effects.exists()

        # The owner reviews the exact action, then approves with the passkey.
        row.get_by_role("link", name="Review").click()
        expect(owner.locator("#action-tool")).to_have_text("bank.wire")
        expect(owner.locator("#action-arguments")).to_contain_text('"to": "ACME GmbH"')
        expect(owner.locator("#action-arguments")).to_contain_text('"amount": 250000')
        expect(owner.locator("#approval-count")).to_have_text("0 of 2")
        screenshot(owner, "approval-detail")
        owner.get_by_role("button", name="Approve with passkey").click()
        expect(owner.get_by_text("Passkey vote recorded.")).to_be_visible()
        expect(owner.locator("#approval-votes")).to_contain_text("passkey")
        assert agent.poll() is None and not effects.exists()  # one of two: still waiting
        expect(owner.locator("html")).to_have_attribute("data-live", "open", timeout=LIVE_TIMEOUT)
        owner.evaluate("window.__noReload = true")

        # The second approver completes the 2-of-2 from the queue.
        risk.goto("/approvals/")
        risk.locator('#approval-queue tr[data-tool="bank.wire"]').get_by_role("link", name="Review").click()
        expect(risk.locator("#approval-count")).to_have_text("1 of 2")
        risk.get_by_role("button", name="Approve with passkey").click()
        expect(risk.get_by_text("Passkey vote recorded: approved.")).to_be_visible()
        # The owner's open page shows the decision and both votes without a reload.
        # (approved, or already consumed: the agent may have started the wire by then)
        expect(owner.locator("#approval-status")).to_have_text(
            re.compile("^(approved|consumed)$"), timeout=LIVE_TIMEOUT
        )
        expect(owner.locator("#approval-votes li")).to_have_count(2)
        assert owner.evaluate("window.__noReload") is True

        # The agent resumes and the wire runs exactly once.
        ready, _, _ = select.select([agent.stdout], [], [], AGENT_DEADLINE)
        assert ready, f"the agent did not resume within {AGENT_DEADLINE} s"
        line = agent.stdout.readline()
        assert line, agent.stderr.read()[-3000:] if agent.stderr else "no output"
        assert json.loads(line) == {"result": "ran"}
        assert agent.wait(timeout=30) == 0
        sent = effects.read_text().splitlines()
        assert [json.loads(s) for s in sent] == [{"amount": 250000, "to": "ACME GmbH", "currency": "EUR"}]

        # The decided request leaves the owner's open queue, still without a reload.
        owner.goto("/approvals/")
        owner.evaluate("window.__noReload = true")
        expect(owner.locator('#approval-queue tr[data-tool="bank.wire"]')).to_have_count(0)
        expect(owner.locator("html")).to_have_attribute("data-live", "open", timeout=LIVE_TIMEOUT)

        # The saga's disclosure proves who approved what, offline.
        verify_disclosure_offline(control_plane, saga_id, tmp_path)
    finally:
        if agent is not None and agent.poll() is None:
            agent.kill()
            agent.wait(timeout=10)
        owner_context.close()
        risk_context.close()


def verify_disclosure_offline(server: LiveServer, saga_id: str, tmp_path: Path) -> None:
    headers = {"Authorization": f"Bearer {server.api_key}"}

    def with_both_votes() -> dict[str, Any] | None:
        """The saga's disclosure once it holds both votes (sealing them takes the worker a while)."""
        answer = httpx.get(
            f"{server.url}/api/v1/audit/sagas/{saga_id}/disclosure", headers=headers, timeout=20
        )
        if answer.status_code != 200:
            return None
        bundle: dict[str, Any] = answer.json()
        events = [e["record"].get("event") for e in bundle.get("records", [])]
        return bundle if events.count("APPROVAL_VOTE") == 2 else None

    bundle = wait_until(with_both_votes, "the saga's disclosure with both votes", deadline=60, every=0.5)
    verifier = httpx.get(f"{server.url}/api/v1/audit/key", headers=headers, timeout=20).text.splitlines()[0]
    path = tmp_path / "disclosure.json"
    path.write_text(json.dumps(bundle))
    result = subprocess.run(
        [sys.executable, "-m", "sagaplane", "verify-approval", str(path), "--key", verifier],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 passkey vote(s) verified" in result.stdout
    assert "user:owner@demo.sagaplane.local approve" in result.stdout
    assert "user:risk@demo.sagaplane.local approve" in result.stdout
