"""The console's confirmation dialog (issue 29), in Chromium with the CSP enforced: a modal
<dialog> named after the button pressed, Cancel focused first; Cancel and Escape submit nothing
(the kill switch stays in force at the gate), confirm submits the form exactly once, focus goes
back to the button, the panel behind is not refreshed away under it; a rollback over an
IRREVERSIBLE step shows its warning in the dialog."""

from __future__ import annotations

import uuid

import httpx
import pytest
from playwright.sync_api import expect

from tests.e2e.browser import OWNER, LiveServer, confirm_dialog, screenshot, sign_in
from tests.support.sagadata import Writer

pytestmark = pytest.mark.e2e


def _decision(server: LiveServer, tool: str) -> str:
    response = httpx.post(
        f"{server.url}/api/v1/gate/evaluate",
        json={"saga_id": f"e2e-cf-{uuid.uuid4().hex[:8]}", "step_id": "1", "tool": tool, "agent": "ops-bot"},
        headers={"Authorization": f"Bearer {server.api_key}"},
        timeout=20,
    )
    assert response.status_code == 200, response.text
    return str(response.json()["decision"])


def test_cancel_and_escape_submit_nothing_and_confirm_submits_once(
    new_page, control_plane: LiveServer
) -> None:  # type: ignore[no-untyped-def]
    page = new_page(height=1000)
    sign_in(page, OWNER)
    page.goto("/fleet/")
    halt = page.locator("#halt-form")
    halt.get_by_label("What to stop").select_option("tool")
    halt.get_by_label("Tool glob, agent name or tag").fill("confirm.*")
    halt.get_by_label("Reason").fill("testing the confirmation dialog")
    halt.get_by_role("button", name="Engage").click()
    panel = page.locator('#kill-switches li[data-halt-scope="tool:confirm.*"]')
    expect(panel).to_be_visible()
    posts: list[str] = []
    page.on("request", lambda request: posts.append(request.url) if request.method == "POST" else None)
    dialog = page.locator("dialog#confirm-dialog")
    resume = panel.get_by_role("button", name="Resume tool:confirm.*")

    resume.click()
    expect(dialog).to_be_visible()
    expect(dialog.get_by_role("heading")).to_have_text("Resume tool:confirm.*?")
    expect(dialog).to_contain_text("Resume tool:confirm.*? Agents may act on it again at once.")
    expect(dialog.locator("#confirm-dialog-ok")).to_have_text("Resume tool:confirm.*")
    expect(dialog.get_by_role("button", name="Cancel")).to_be_focused()
    # The panel refreshes every few seconds; under an open dialog it waits (its form stays).
    expect(page.locator("#fleet-controls")).to_have_attribute("data-held", "1")
    dialog.get_by_role("button", name="Cancel").click()
    expect(dialog).to_be_hidden()
    expect(resume).to_be_focused()

    page.keyboard.press("Enter")  # the focused Resume asks again; Escape closes it
    expect(dialog).to_be_visible()
    page.keyboard.press("Escape")
    expect(dialog).to_be_hidden()
    expect(resume).to_be_focused()
    page.reload()
    expect(panel).to_be_visible()
    assert posts == [] and _decision(control_plane, "confirm.run") == "deny"

    resume.click()
    confirm_dialog(page, "Agents may act on it again at once.", action="Resume tool:confirm.*")
    expect(panel).to_have_count(0)
    expect(page.locator(".messages")).to_be_visible()
    assert len(posts) == 1 and posts[0].endswith("/resume"), posts  # one POST, the form's own
    assert _decision(control_plane, "confirm.run") == "allow"


def test_a_rollback_over_an_irreversible_step_warns_in_the_dialog(
    new_page, control_plane: LiveServer
) -> None:  # type: ignore[no-untyped-def]
    writer = Writer()
    saga_id = f"e2e-confirm-{uuid.uuid4().hex[:8]}"
    records = [writer.record("SAGA_START", saga_id=saga_id, name="payout", lease_ttl=300)]
    for n, (tool, semantics) in enumerate(
        [("ledger.reserve", "COMPENSABLE"), ("bank.wire", "IRREVERSIBLE"), ("mail.send", "COMPENSABLE")],
        start=1,
    ):
        step = {"saga_id": saga_id, "step_id": f"{saga_id}-s{n}", "tool": tool, "semantics": semantics}
        compensation = (
            None
            if semantics == "IRREVERSIBLE"
            else {"handler": f"undo.{tool}", "recoverable": True, "kwargs": {}, "idempotency_key": f"{n}"}
        )
        records += [
            writer.record("STEP_INTENT", **step, kwargs={"n": n}),
            writer.record("STEP_COMMITTED", **step, compensation=compensation),
        ]
    records.append(writer.record("SAGA_COMPLETE", saga_id=saga_id, clean=True))
    control_plane.ship(f"e2e-{saga_id}", records)

    page = new_page(height=1100)  # the whole page under the backdrop in the screenshot
    sign_in(page, OWNER)
    page.goto(f"/sagas/{saga_id}/")
    page.locator("#rollback-to-1").click()
    dialog = page.locator("dialog#confirm-dialog")
    warning = dialog.locator(".confirm-warning")
    expect(warning).to_be_visible()
    expect(warning).to_contain_text("step 2 (bank.wire) cannot be undone (IRREVERSIBLE)")
    expect(dialog.locator("#confirm-dialog-ok")).to_have_text("Rollback to here")
    screenshot(page, "console-confirm-rollback")
    dialog.get_by_role("button", name="Cancel").click()
    page.reload()
    expect(page.locator("#saga-status")).to_have_attribute("data-status", "completed")

    page.locator("#rollback-to-1").click()
    confirm_dialog(page, "Compensate every step after step 1, newest first", action="Rollback to here")
    expect(page.locator("#saga-status")).to_have_attribute("data-status", "recovering")
