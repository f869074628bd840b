"""A refusal an agent's SDK makes on its own view of a halt, in the console's denials (issue 29,
item 3), in Chromium with the CSP enforced: an owner halts payroll.* on the Fleet page; a real SDK
agent process learns of it from its fleet-state long-poll, refuses its payroll.run locally (no gate
call) and ships the GATE_DENY with its WAL; the denials view, filtered to refusals by the agent's
SDK, lists it with the agent's name and stream and the halt's reason."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from playwright.sync_api import expect

from tests.e2e.browser import OWNER, LiveServer, confirm_dialog, screenshot, sign_in

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]

AGENT = textwrap.dedent(
    """
    import json, sys
    import sagaplane as sp
    from tests.support.waiting import wait_until

    runtime = sp.configure(sys.argv[1], agent="payroll-bot", stream_id="payroll-wal", gate=True, ship=True)
    pay = sp.tool(lambda amount: amount, name="payroll.run", semantics=sp.COMPENSABLE)
    # Wait for this agent's own view (its fleet-state long-poll) to show the halt.
    wait_until(
        lambda: any(h.get("scope") == "tool:payroll.*" for h in sp.status()["halts"]),
        "the halt to reach the agent",
    )
    try:
        with sp.saga(name="monthly payroll"):
            pay(1200)
        outcome = "ran"
    except sp.SagaAborted as aborted:
        cause = aborted.cause
        outcome = cause.reason if isinstance(cause, sp.GateDenied) else repr(cause)
    print(json.dumps({"outcome": outcome, "shipped": runtime.flush(60)}), flush=True)
    sp.shutdown()
    """
)


def test_an_agents_own_refusal_is_listed_as_the_agents(  # type: ignore[no-untyped-def]
    new_page, control_plane: LiveServer, tmp_path: Path
) -> None:
    page = new_page(height=1200)
    sign_in(page, OWNER)
    page.goto("/fleet/")
    halt = page.locator("#halt-form")
    halt.get_by_label("What to stop").select_option("tool")
    halt.get_by_label("Tool glob, agent name or tag").fill("payroll.*")
    halt.get_by_label("Reason").fill("payroll freeze for the audit")
    halt.get_by_role("button", name="Engage").click()
    expect(page.locator('#kill-switches li[data-halt-scope="tool:payroll.*"]')).to_be_visible()

    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "SAGAPLANE_URL": control_plane.url,
        "SAGAPLANE_API_KEY": control_plane.api_key,
    }
    agent = subprocess.run(
        [sys.executable, "-c", AGENT, str(tmp_path / "payroll.wal")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert agent.returncode == 0, agent.stderr[-3000:]
    assert json.loads(agent.stdout.strip().splitlines()[-1]) == {"outcome": "halted", "shipped": True}

    page.goto("/fleet/denials/")
    page.get_by_label("Tool").fill("payroll.run")
    page.get_by_label("Refused by").select_option("agent")
    page.get_by_role("button", name="Filter").click()
    expect(page).to_have_url("/fleet/denials/?tool=payroll.run&agent=&reason=&source=agent&since=")
    rows = page.locator("#denials-table tbody tr")
    expect(rows).to_have_count(1)
    expect(rows.first).to_have_attribute("data-source", "agent")
    expect(rows.first).to_contain_text("payroll-bot")
    expect(rows.first).to_contain_text("payroll-wal")
    expect(rows.first).to_contain_text("Agent's SDK")
    expect(rows.first).to_contain_text("kill switch tool:payroll.*: payroll freeze for the audit")
    screenshot(page, "console-denials-by-agent")

    # The gate never saw the call: nothing of it is listed as the gate's.
    page.get_by_label("Refused by").select_option("server")
    page.get_by_role("button", name="Filter").click()
    expect(page.locator("#no-denials")).to_be_visible()

    # The freeze is lifted again (the browser tests share one tenant: a halt left in force would
    # hold every later test's payroll.* and show on every later Fleet page).
    page.goto("/fleet/")
    page.get_by_role("button", name="Resume tool:payroll.*").click()
    confirm_dialog(page, "Resume tool:payroll.*?", action="Resume tool:payroll.*")
    expect(page.locator('#kill-switches li[data-halt-scope="tool:payroll.*"]')).to_have_count(0)
