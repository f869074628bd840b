"""The lease TTL in a real browser against a real server: an owner sets it on the Fleet page, a
hostile value is refused beside its field with the form as typed, the next lease an agent is
granted lives the new TTL, and a viewer sees it but is offered no form."""

from __future__ import annotations

import uuid

import httpx
import pytest
from playwright.sync_api import expect

from tests.e2e.browser import OWNER, VIEWER, LiveServer, screenshot, sign_in

pytestmark = pytest.mark.e2e


def lease(server: LiveServer) -> dict:
    response = httpx.post(
        f"{server.url}/api/v1/gate/leases",
        json={
            "lease_id": str(uuid.uuid4()),
            "calls": 2,
            "saga_id": f"e2e-lease-{uuid.uuid4().hex[:8]}",
            "tool": "charge_card",  # the demo's budget: card spend per minute
            "args": {"amount_cents": 100},
            "agent": "e2e-lease-bot",
        },
        headers={"Authorization": f"Bearer {server.api_key}"},
        timeout=20,
    )
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["decision"] == "lease", answer
    httpx.post(
        f"{server.url}/api/v1/gate/leases/{answer['lease_id']}/return",
        json={"used": {}},
        headers={"Authorization": f"Bearer {server.api_key}"},
        timeout=20,
    )
    return answer


def test_owner_sets_the_lease_ttl_and_the_next_grant_lives_it(new_page, control_plane: LiveServer) -> None:
    page = new_page(height=1600)
    sign_in(page, OWNER)
    page.goto("/fleet/")
    expect(page.locator("#lease-ttl-note")).to_contain_text("1000 ms")

    form = page.locator("#settings-form")
    form.get_by_label("Lease lifetime (ms)").fill("50")
    form.get_by_role("button", name="Set lease lifetime").click()
    expect(page.locator("#s-lease-ttl-error")).to_contain_text("from 100 to 60000")
    expect(page.locator("#s-lease-ttl")).to_have_attribute("aria-invalid", "true")
    expect(page.locator("#s-lease-ttl")).to_have_value("50")  # the form as it was typed
    assert lease(control_plane)["ttl_ms"] == 1000  # nothing changed

    form = page.locator("#settings-form")
    form.get_by_label("Lease lifetime (ms)").fill("2500")
    form.get_by_role("button", name="Set lease lifetime").click()
    expect(page.get_by_text("Budget leases now live 2500 ms unless renewed.")).to_be_visible()
    expect(page.locator("#lease-ttl-note")).to_contain_text("2500 ms")
    expect(page.locator("#s-lease-ttl")).to_have_value("2500")
    assert lease(control_plane)["ttl_ms"] == 2500
    screenshot(page, "fleet-lease-ttl")

    viewer = new_page()
    sign_in(viewer, VIEWER)
    viewer.goto("/fleet/")
    expect(viewer.locator("#lease-ttl-note")).to_contain_text("2500 ms")
    expect(viewer.locator("#settings-form")).to_have_count(0)

    form = page.locator("#settings-form")
    form.get_by_label("Lease lifetime (ms)").fill("")
    form.get_by_role("button", name="Set lease lifetime").click()
    expect(page.get_by_text("Budget leases now live the default, 1000 ms unless renewed.")).to_be_visible()
    assert lease(control_plane)["ttl_ms"] == 1000
