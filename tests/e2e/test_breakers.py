"""Circuit breakers in a real browser against a real server: an owner sets one on the Fleet page
(no JSON typed), a hostile rate is refused beside its field, agents' failures shipped over HTTP
open it, the page shows it open with its history without a reload, the gate refuses
`circuit_open`, and another tenant's owner sees none of it."""

from __future__ import annotations

import re
import uuid

import httpx
import pytest
from playwright.sync_api import expect

from tests.e2e.browser import CAROL, LIVE_TIMEOUT, OWNER, LiveServer, confirm_dialog, screenshot, sign_in
from tests.support.chains import chain

pytestmark = pytest.mark.e2e


def gate(server: LiveServer, saga: str, tool: str) -> dict:
    response = httpx.post(
        f"{server.url}/api/v1/gate/evaluate",
        json={"saga_id": saga, "step_id": "1", "tool": tool, "args": {}, "agent": "e2e-bot"},
        headers={"Authorization": f"Bearer {server.api_key}"},
        timeout=20,
    )
    assert response.status_code == 200, response.text
    return response.json()


def failures(server: LiveServer, tool: str, n: int) -> None:
    bodies = []
    for k in range(n):
        step = {"saga_id": f"e2e-cb-{uuid.uuid4().hex[:8]}-{k}", "step_id": "1", "tool": tool}
        bodies += [{"event": "STEP_INTENT", **step}, {"event": "STEP_FAILED", **step, "error": "timeout"}]
    server.ship(f"e2e-breaker-{uuid.uuid4().hex[:8]}", chain(bodies))


def test_owner_sets_a_breaker_that_agents_failures_open_and_the_page_shows_it(
    new_page, control_plane: LiveServer
) -> None:
    page = new_page(height=1600)
    sign_in(page, OWNER)
    page.goto("/fleet/")

    form = page.locator("#breaker-form")
    form.get_by_label("Name").fill("vendor down")
    form.get_by_label("Tools (glob)").fill("vendor.*")
    form.get_by_label("Opens after failures in a row").fill("3")
    form.get_by_label("…or when this share of calls failed (%)").fill("fifty")
    form.get_by_role("button", name="Set circuit breaker").click()
    error = page.locator("#cb-rate-error")
    expect(error).to_contain_text("failure_rate must be a number")
    expect(page.locator("#cb-rate")).to_have_attribute("aria-invalid", "true")
    expect(page.locator("#cb-name")).to_have_value("vendor down")  # the form as it was typed
    expect(page.locator('[data-breaker="vendor down"]')).to_have_count(0)

    form = page.locator("#breaker-form")
    form.get_by_label("…or when this share of calls failed (%)").fill("50")
    form.get_by_label("…of at least (calls)").fill("20")
    form.get_by_label("Tries one call again after").fill("10")
    form.get_by_label("Cool-down unit").select_option("min")
    form.get_by_role("button", name="Set circuit breaker").click()
    expect(page.get_by_text("Circuit breaker 'vendor down' set on vendor.*")).to_be_visible()
    panel = page.locator('[data-breaker="vendor down"]')
    expect(panel).to_have_attribute("data-phase", "closed")
    expect(panel).to_contain_text("opens after 3 failures in a row, or when 50% of at least 20 calls")
    expect(page.locator("html")).to_have_attribute("data-refreshed", re.compile(r"\d+"), timeout=LIVE_TIMEOUT)
    page.evaluate("window.__noReload = true")

    assert gate(control_plane, "before", "vendor.pay")["decision"] == "allow"
    failures(control_plane, "VENDOR.pay", 3)  # matched as halts are: any case

    expect(panel).to_have_attribute("data-phase", "open", timeout=LIVE_TIMEOUT)
    expect(panel.locator(".breaker-badge")).to_have_text("Open")
    entry = panel.locator('li[data-transition="closed-open"]')
    expect(entry).to_contain_text("3 consecutive failures (threshold 3)")
    assert page.evaluate("window.__noReload") is True  # refreshed in place, not reloaded
    refused = gate(control_plane, "after", "vendor.pay")
    assert (refused["decision"], refused["reason"]) == ("deny", "circuit_open")
    assert refused["breaker"] == "vendor down"
    expect(page.locator('#denials-table tr[data-reason="circuit_open"]')).to_contain_text(
        "circuit breaker 'vendor down' is open", timeout=LIVE_TIMEOUT
    )
    screenshot(page, "fleet-breaker-open")

    other = new_page()
    sign_in(other, CAROL)
    other.goto("/fleet/")
    expect(other.locator("#no-breakers")).to_be_visible()
    expect(other.locator('[data-breaker="vendor down"]')).to_have_count(0)
    assert "vendor down" not in other.content()

    panel.get_by_role("button", name="Delete circuit breaker vendor down").click()
    confirm_dialog(
        page, "Delete the circuit breaker 'vendor down'?", action="Delete circuit breaker vendor down"
    )
    expect(page.get_by_text("Circuit breaker 'vendor down' deleted.")).to_be_visible()
    assert gate(control_plane, "deleted", "vendor.pay")["decision"] == "allow"
