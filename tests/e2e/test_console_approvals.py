"""The approval inbox as risk staff drive it (issue 29, item 1), in Chromium with the CSP enforced:
the navigation's pending count follows the requests live, the requester's reason is read first,
amounts carry their separators and the call's currency, votes show when they were cast, the
heading and the summary follow the request's live state to the end (consumed), a browser
notification is offered (opt-in) and shown for a new request; another tenant sees none of it."""

from __future__ import annotations

import re
import uuid
from typing import Any

import httpx
import pytest
from playwright.sync_api import expect

from tests.e2e.browser import CAROL, LIVE_TIMEOUT, OWNER, RISK, LiveServer, screenshot, sign_in, wait_live

pytestmark = pytest.mark.e2e

# The browser's Notification, recorded instead of shown (headless Chromium shows none): the
# page's own code asks the permission and constructs the notification, the test reads both.
RECORD_NOTIFICATIONS = """
window.__notified = [];
window.Notification = function (title, options) {
  window.__notified.push({ title: title, body: (options || {}).body || "" });
};
window.Notification.permission = "default";
window.Notification.requestPermission = function () {
  window.Notification.permission = "granted";
  return Promise.resolve("granted");
};
"""
REASON = "Quarterly payment to our packaging supplier, invoice 2026-114"


def _ask(server: LiveServer, saga_id: str, **extra: Any) -> dict[str, Any]:
    response = httpx.post(
        f"{server.url}/api/v1/gate/evaluate",
        json={
            "saga_id": saga_id,
            "step_id": "1",
            "tool": "treasury.transfer",
            "semantics": "IRREVERSIBLE",
            "args": {"amount": 25000, "currency": "EUR", "to": "Kartonage GmbH"},
            "agent": "treasury-bot",
            **extra,
        },
        headers={"Authorization": f"Bearer {server.api_key}"},
        timeout=20,
    )
    assert response.status_code == 200, response.text
    return response.json()


def _badge(page: Any) -> int:
    text = page.locator("#approvals-pending").inner_text().strip()
    return int(re.sub(r"\D", "", text) or 0)


def test_the_inbox_counts_explains_and_follows_a_request_to_its_end(
    new_page, control_plane: LiveServer
) -> None:  # type: ignore[no-untyped-def]
    owner = new_page()
    owner.add_init_script(RECORD_NOTIFICATIONS)
    sign_in(owner, OWNER)
    owner.goto("/approvals/policies/")
    form = owner.locator("#policy-form")
    form.get_by_label("Name", exact=True).fill("treasury transfers")
    form.get_by_label("Tools (glob)").fill("treasury.*")
    form.get_by_label("Argument of condition 1").fill("amount")
    form.get_by_label("Operator of condition 1").select_option(label="is more than")
    form.get_by_label("Value of condition 1").fill("1000")
    form.get_by_label("Approvals required").fill("2")
    form.get_by_role("button", name="Create policy").click()
    expect(owner.get_by_text("Approval policy 'treasury transfers' created.")).to_be_visible()

    # Opt in to browser notifications from the inbox (a button, reached by keyboard).
    owner.goto("/approvals/")
    wait_live(owner)
    toggle = owner.get_by_role("button", name="Notify me in this browser")
    toggle.focus()
    owner.keyboard.press("Enter")
    expect(owner.locator("#notify-toggle")).to_have_attribute("aria-pressed", "true")
    expect(owner.locator("#notify-toggle")).to_have_text("Browser notifications: on")
    before = _badge(owner)
    owner.evaluate("window.__noReload = true")

    # The agent asks, with its reason: the badge counts it and a notification says so, live.
    saga_id = f"e2e-treasury-{uuid.uuid4().hex[:8]}"
    answer = _ask(control_plane, saga_id, reason=REASON)
    assert answer["decision"] == "pending_approval", answer
    approval_id = answer["approval_id"]
    expect(owner.locator("#approvals-pending")).to_have_text(
        re.compile(rf"\b{before + 1}\b"), timeout=LIVE_TIMEOUT
    )
    expect(owner.get_by_role("link", name=re.compile(rf"^Approvals\W+{before + 1} pending$"))).to_be_visible()
    # With the count shown, the owner's navigation and account controls still share one line.
    account = owner.locator(".topbar .account").bounding_box()
    last = owner.locator(".topbar .mainnav li").last.bounding_box()
    assert account is not None and last is not None
    assert abs(account["y"] - last["y"]) < last["height"], (account, last)
    row = owner.locator(f'#approval-queue tr[data-approval="{approval_id}"]')
    expect(row).to_contain_text("25,000 EUR", timeout=LIVE_TIMEOUT)
    expect(row).to_contain_text(REASON)
    notified = owner.evaluate("window.__notified")
    assert {
        "title": "Approval requested: treasury.transfer",
        "body": f"{REASON} · needs 2 approval(s)",
    } in notified
    assert owner.evaluate("window.__noReload") is True
    screenshot(owner, "console-approvals-inbox")

    # The request in full: the reason first, the amount with its currency, the question asked.
    row.get_by_role("link", name="Review").click()
    expect(owner.locator("h1")).to_have_text("Approve treasury.transfer?")
    expect(owner.locator("#approval-reason")).to_contain_text(REASON)
    expect(owner.locator("#action-amount")).to_have_text("25,000 EUR")
    owner.get_by_role("button", name="Approve", exact=True).click()
    expect(owner.get_by_text("Vote recorded.")).to_be_visible()
    expect(owner.locator("#approval-count")).to_have_text("1 of 2")
    vote_time = owner.locator("#approval-votes li .vote-time").first
    expect(vote_time).to_contain_text("just now")
    expect(vote_time).to_contain_text(re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC"))
    wait_live(owner)
    owner.evaluate("window.__noReload = true")

    # The second approver decides; the owner's open page follows without a reload.
    risk = new_page()
    sign_in(risk, RISK)
    risk.goto(f"/approvals/{approval_id}/")
    risk.get_by_role("button", name="Approve", exact=True).click()
    expect(risk.get_by_text("Vote recorded: approved.")).to_be_visible()
    expect(owner.locator("h1")).to_have_text(
        "treasury.transfer: approved, not started yet", timeout=LIVE_TIMEOUT
    )
    expect(owner.locator("#approval-count")).to_have_text("2 of 2")
    expect(owner.locator("#approvals-pending")).to_have_text(
        re.compile(rf"^\D*{before}\D*$" if before else r"^$")
    )

    # The agent starts it: heading, status and count agree (consumed, 2 of 2).
    assert _ask(control_plane, saga_id, reason=REASON)["decision"] == "allow"
    expect(owner.locator("h1")).to_have_text("treasury.transfer: approved and started", timeout=LIVE_TIMEOUT)
    expect(owner.locator("#approval-status")).to_have_text("consumed")
    expect(owner.locator("#approval-count")).to_have_text("2 of 2")
    assert owner.evaluate("window.__noReload") is True
    screenshot(owner, "console-approval-consumed")

    # Another tenant sees none of it: no count, no request, no fragment.
    carol = new_page()
    sign_in(carol, CAROL)
    carol.goto("/approvals/")
    expect(carol.locator("#approvals-pending")).to_have_text("")
    expect(carol.locator(f'tr[data-approval="{approval_id}"]')).to_have_count(0)
    for path in (f"/approvals/{approval_id}/", f"/approvals/{approval_id}/state"):
        assert carol.request.get(path).status == 404, path
    assert carol.request.get("/approvals/pending-badge").text() == ""
