"""Done when: an owner installs the app, a pending wire appears in the channel, a linked approver
clicks Approve, the agent resumes, and the message shows who decided.

A real agent process (the SDK, gate on) against a live control plane (HTTP), the owner's browser
through OAuth against the local Slack server, Slack's signed click over HTTP. The Slack work runs
in-process (Celery eager) in the server's thread after each commit, as a worker would. Postgres
only: SQLite's shared in-memory test database does not take concurrent requests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import httpx
import pytest

from slackapp import services
from tenants.actors import named_actor
from tests.slackapp.slack_server import FakeSlack
from tests.support.approvals import Agent, wire_policy
from tests.support.factories import Person
from tests.support.scoping import in_tenant
from tests.support.slack import browser, click_body, install
from tests.support.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
DEADLINE = 60.0

AGENT = textwrap.dedent(
    """
    import json, pathlib, sys
    import sagaplane as sp

    wal, effects = sys.argv[1], pathlib.Path(sys.argv[2])
    sp.configure(wal, agent="payments-bot", ship=False, gate=True)

    def wire(amount, to, currency):
        with effects.open("a") as out:  # the effect: one line per wire sent
            out.write(json.dumps({"amount": amount, "to": to}) + "\\n")
        return {"sent": amount}

    bank_wire = sp.tool(wire, name="bank.wire", semantics=sp.IRREVERSIBLE, confirm=lambda request: True)
    print(json.dumps({"ready": True}), flush=True)
    try:
        with sp.saga(name="payout"):
            bank_wire(amount=250000, to="ACME GmbH", currency="EUR")
        print(json.dumps({"result": "ran"}), flush=True)
    except sp.SagaAborted as aborted:
        reason = str(getattr(aborted.cause, "reason", aborted.cause))
        print(json.dumps({"result": "refused", "reason": reason}), flush=True)
    """
)


@pytest.mark.postgres  # the live server answers the gate and the agent's long-polls at once
def test_a_pending_wire_is_approved_from_slack_and_the_agent_resumes(
    transactional_db: None,
    live_server: Any,
    slack: FakeSlack,
    agent: Agent,
    alice: Person,
    ann: Person,
    tmp_path: Path,
) -> None:
    install(browser(alice.user), slack)
    in_tenant(
        services.link_user,
        ann.tenant,
        ann.user,
        team_id=slack.team_id,
        slack_user_id="U0ANN",
        how="confirmed",
        actor=named_actor("test"),
    )
    wire_policy(agent.tenant)
    effects = tmp_path / "effects.jsonl"
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "SAGAPLANE_URL": live_server.url,
        "SAGAPLANE_API_KEY": agent.raw_key,
    }
    process = subprocess.Popen(
        [sys.executable, "-c", AGENT, str(tmp_path / "agent.wal"), str(effects)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        assert json.loads(process.stdout.readline()) == {"ready": True}
        # The gate opened a request: its message appears in the channel, with the buttons.
        message = wait_until(lambda: slack.channel_messages("C0RISK"), "the request's message")[0]
        (approve,) = [
            e
            for b in message.blocks
            if b["type"] == "actions"
            for e in b["elements"]
            if e["action_id"] == "approve"
        ]
        assert "250,000 EUR" in json.dumps(message.blocks)
        assert not effects.exists()  # the agent waits
        # Slack's signed click, over HTTP.
        body = click_body(slack, "approve", approve["value"], user="U0ANN")
        headers = {k.removeprefix("HTTP_").replace("_", "-"): v for k, v in slack.sign(body).items()}
        answer = httpx.post(
            f"{live_server.url}/slack/interactions",
            content=body,
            headers={**headers, "Content-Type": "application/x-www-form-urlencoded"},
            timeout=30,
        )
        assert answer.status_code == 200
        out, err = process.communicate(timeout=DEADLINE)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert json.loads(out.strip().splitlines()[-1]) == {"result": "ran"}, err[-3000:]
    assert [json.loads(line) for line in effects.read_text().splitlines()] == [
        {"amount": 250000, "to": "ACME GmbH"}
    ]
    # The message shows who decided, and the buttons are gone.
    updated = wait_until(
        lambda: [m for m in slack.channel_messages("C0RISK") if m.updates], "the message's update"
    )[0]
    text = json.dumps(updated.blocks)
    assert "Approved" in text and "<@U0ANN>" in text and ann.user.username in text
    assert [b for b in updated.blocks if b["type"] == "actions"] == []
