"""Acknowledge and assign a step that needs a human (issue 29, item 4), in Chromium with the CSP
enforced: a rollback reaches a step nobody can undo; on Recovery the owner acknowledges it ("I take
it"), then hands it to the approver; the row says who has it, the API reads the same back, a viewer
sees who has it but no controls, and axe finds nothing serious on the page."""

from __future__ import annotations

import uuid
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import expect

from tests.e2e.browser import (
    OWNER,
    RISK,
    RUN_AXE,
    SERIOUS,
    VIEWER,
    LiveServer,
    confirm_dialog,
    screenshot,
    sign_in,
)
from tests.support.sagadata import Writer

pytestmark = pytest.mark.e2e
AXE = Path(__file__).parent / "vendor" / "axe-core" / "axe.min.js"


def _saga_with_a_step_nobody_can_undo(server: LiveServer) -> str:
    writer = Writer()
    saga_id = f"e2e-assign-{uuid.uuid4().hex[:8]}"
    first = {
        "saga_id": saga_id,
        "step_id": f"{saga_id}-s1",
        "tool": "reserve_stock",
        "semantics": "COMPENSABLE",
    }
    second = {
        "saga_id": saga_id,
        "step_id": f"{saga_id}-s2",
        "tool": "wire_funds",
        "semantics": "COMPENSABLE",
    }
    compensation = {
        "fn": "undo_reserve_stock",
        "handler": "shop.undo_reserve_stock",
        "recoverable": True,
        "description": "",
        "idempotency_key": f"{saga_id}-s1:undo",
        "kwargs": {"order": "A-17"},
    }
    server.ship(
        f"e2e-{saga_id}",
        [
            writer.record("SAGA_START", saga_id=saga_id, name="assign", lease_ttl=300),
            writer.record("STEP_INTENT", **first, kwargs={"order": "A-17"}),
            writer.record("STEP_COMMITTED", **first, compensation=compensation),
            writer.record("STEP_INTENT", **second, kwargs={"amount": 25_000}),
            writer.record("STEP_COMMITTED", **second),  # no compensation: a person must deal with it
            writer.record("SAGA_COMPLETE", saga_id=saga_id, clean=True),
        ],
    )
    return saga_id


def test_a_step_that_needs_a_human_is_acknowledged_and_assigned(new_page, control_plane: LiveServer) -> None:  # type: ignore[no-untyped-def]
    saga_id = _saga_with_a_step_nobody_can_undo(control_plane)
    page = new_page(height=1200)
    sign_in(page, OWNER)
    page.goto(f"/sagas/{saga_id}/")
    page.locator("#rollback-to-1").click()
    confirm_dialog(page, "Compensate every step after step 1, newest first", action="Rollback to here")
    page.goto("/recovery/")
    row = page.locator(f'#human-queue tr[data-saga="{saga_id}"]')
    expect(row).to_contain_text("Nobody yet")
    row.get_by_role("button", name="Acknowledge: I take it").click()
    row = page.locator(f'#human-queue tr[data-saga="{saga_id}"]')
    expect(row.locator(".assignee")).to_contain_text("You")
    expect(page.locator(".messages")).to_contain_text("is now with you")
    row.get_by_label("Assign to").select_option(RISK)
    row.get_by_label("Assign to").focus()
    page.keyboard.press("Tab")
    page.keyboard.press("Enter")  # the Assign button, from the keyboard
    row = page.locator(f'#human-queue tr[data-saga="{saga_id}"]')
    expect(row.locator(".assignee")).to_contain_text(RISK)
    screenshot(page, "console-recovery-assigned")
    page.evaluate(AXE.read_text(encoding="utf-8"))
    serious = [v for v in page.evaluate(RUN_AXE) if v["impact"] in SERIOUS]
    assert serious == []

    # Stored, and read back the same through the API.
    jobs = httpx.get(
        f"{control_plane.url}/api/v1/recovery/jobs",
        params={"saga_id": saga_id},
        headers={"Authorization": f"Bearer {control_plane.api_key}"},
        timeout=20,
    )
    assert jobs.status_code == 200, jobs.text
    (waiting,) = [j for j in jobs.json()["jobs"] if j["state"] == "escalated"]
    assert waiting["assignee"] == RISK and waiting["assigned_at"]

    viewer = new_page()
    sign_in(viewer, VIEWER)
    viewer.goto("/recovery/")
    seen = viewer.locator(f'#human-queue tr[data-saga="{saga_id}"]')
    expect(seen.locator(".assignee")).to_contain_text(RISK)
    expect(seen.get_by_label("Assign to")).to_have_count(0)
