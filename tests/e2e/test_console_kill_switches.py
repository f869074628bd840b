"""Kill switches with their history and the denials view (issue 29, item 3), in Chromium with the
CSP enforced: an owner engages a halt on the Fleet page, an agent is refused, the halt is lifted;
the history says who engaged and who lifted it, the denials view finds the refusal by reason and
tool (keyboard only), and another tenant sees neither."""

from __future__ import annotations

import uuid

import httpx
import pytest
from playwright.sync_api import expect

from tests.e2e.browser import CAROL, OWNER, LiveServer, confirm_dialog, screenshot, sign_in

pytestmark = pytest.mark.e2e


def _ask(server: LiveServer, tool: str) -> dict:
    response = httpx.post(
        f"{server.url}/api/v1/gate/evaluate",
        json={"saga_id": f"e2e-ks-{uuid.uuid4().hex[:8]}", "step_id": "1", "tool": tool, "agent": "ops-bot"},
        headers={"Authorization": f"Bearer {server.api_key}"},
        timeout=20,
    )
    assert response.status_code == 200, response.text
    return response.json()


def test_a_kill_switch_leaves_history_and_its_refusals_are_found(new_page, control_plane: LiveServer) -> None:  # type: ignore[no-untyped-def]
    page = new_page(height=1200)
    sign_in(page, OWNER)
    page.goto("/fleet/")
    halt = page.locator("#halt-form")
    halt.get_by_label("What to stop").select_option("tool")
    halt.get_by_label("Tool glob, agent name or tag").fill("ledger.*")
    halt.get_by_label("Reason").fill("reconciliation mismatch in the ledger")
    halt.get_by_role("button", name="Engage").click()
    panel = page.locator('#kill-switches li[data-halt-scope="tool:ledger.*"]')
    expect(panel).to_contain_text("reconciliation mismatch")
    refused = _ask(control_plane, "ledger.post")
    assert (refused["decision"], refused["reason"]) == ("deny", "halted")
    panel.get_by_role("button", name="Resume tool:ledger.*").click()
    confirm_dialog(
        page, "Resume tool:ledger.*? Agents may act on it again at once.", action="Resume tool:ledger.*"
    )
    expect(panel).to_have_count(0)

    page.get_by_role("link", name="History: every kill switch").click()
    row = page.locator('#halt-history tr[data-halt-scope="tool:ledger.*"]').first
    expect(row).to_have_attribute("data-halt-state", "lifted")
    expect(row).to_contain_text("by user:owner@demo.sagaplane.local")
    expect(row).to_contain_text("lifted by user:owner@demo.sagaplane.local")
    screenshot(page, "console-kill-switch-history")

    page.goto("/fleet/denials/")
    page.get_by_label("Tool").fill("ledger.post")
    page.get_by_label("Reason").select_option("halted")
    page.get_by_label("Tool").press("Enter")  # the form submits from the keyboard
    expect(page).to_have_url("/fleet/denials/?tool=ledger.post&agent=&reason=halted&source=&since=")
    found = page.locator('#denials-table tr[data-tool="ledger.post"]')
    expect(found.first).to_contain_text("reconciliation mismatch")
    expect(found.first).to_contain_text("ops-bot")
    screenshot(page, "console-denials-filtered")

    carol = new_page()
    sign_in(carol, CAROL)
    carol.goto("/fleet/halts/history")
    expect(carol.locator("#no-halt-history")).to_be_visible()
    carol.goto("/fleet/denials/?tool=ledger.post")
    expect(carol.locator("#no-denials")).to_be_visible()
