"""Reserve, then settle, on the Fleet page in a real browser: agents reserve estimates at the
gate (`reserve`) and settle the real amounts (one below its estimate, one above); the budget's
gauge shows what is reserved, what is settled and the overrun, without a reload."""

from __future__ import annotations

import re

import httpx
import pytest
from playwright.sync_api import expect

from tests.e2e.browser import LIVE_TIMEOUT, OWNER, LiveServer, screenshot, sign_in

pytestmark = pytest.mark.e2e


def post(server: LiveServer, path: str, body: dict) -> dict:
    response = httpx.post(
        f"{server.url}{path}", json=body, headers={"Authorization": f"Bearer {server.api_key}"}, timeout=20
    )
    assert response.status_code == 200, response.text
    return response.json()


def reserve(server: LiveServer, n: int, estimate: str) -> str:
    call = {"saga_id": f"e2e-reserve-{n}", "step_id": "1", "tool": "metered.call", "agent": "llm-bot"}
    answer = post(server, "/api/v1/gate/evaluate", {**call, "reserve": estimate})
    assert answer["decision"] == "allow" and answer["reservation"]["reserved"] == estimate, answer
    return str(answer["reservation"]["id"])


def test_the_fleet_page_shows_reserved_settled_and_overrun(new_page, control_plane: LiveServer) -> None:
    page = new_page(height=1400)
    sign_in(page, OWNER)
    page.goto("/fleet/")
    budget = page.locator("#budget-form")
    budget.get_by_label("Name").fill("metered tokens")
    budget.get_by_label("Tools (glob)").fill("metered.*")
    budget.get_by_label("Argument counted").fill("tokens")
    budget.get_by_label("At most").fill("1000")
    budget.get_by_label("Per", exact=True).fill("1")
    budget.get_by_label("Window unit").select_option("d")
    budget.get_by_role("button", name="Set budget").click()
    expect(page.get_by_text("Budget 'metered tokens' set")).to_be_visible()
    expect(page.locator("html")).to_have_attribute("data-refreshed", re.compile(r"\d+"), timeout=LIVE_TIMEOUT)
    page.evaluate("window.__noReload = true")

    under, over, _open = (reserve(control_plane, n, e) for n, e in enumerate(["300", "100", "200"]))
    assert (
        post(control_plane, f"/api/v1/gate/reservations/{under}/settle", {"actual": "120"})["overrun"] == "0"
    )
    assert post(control_plane, f"/api/v1/gate/reservations/{over}/settle", {"actual": 150})["overrun"] == "50"

    gauge = page.locator('[data-budget="metered tokens"] .gauge[data-scope="fleet"]')
    held = gauge.locator(".reservations")
    expect(gauge).to_have_attribute("data-used", "470", timeout=LIVE_TIMEOUT)
    expect(held).to_have_attribute("data-reserved", "200")
    expect(held).to_have_attribute("data-settled", "270")
    expect(held).to_have_attribute("data-overrun", "50")
    expect(held).to_contain_text("200 reserved, 270 settled, 50 over their estimates")
    assert page.evaluate("window.__noReload") is True
    screenshot(page, "fleet-reservations")
