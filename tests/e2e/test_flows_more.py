"""The last dashboard flows in a real browser, where the pages' CSP is enforced (issue 23, item 10):
the Reconciliation page's "Check again" on a drift verdict; the Slack account link a Slack user is
sent after a signed slash command from an unlinked account, confirmed and then unlinked on its
page; an owner's break-glass approval. Each asserts what the page shows, what is stored (read back
through the API or Slack), and that the CSP blocked nothing."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlencode

import httpx
import pytest
from playwright.sync_api import expect

from tests.e2e.browser import (
    OWNER,
    LiveServer,
    api_call,
    claim_offered,
    confirm_dialog,
    csp_watched,
    screenshot,
    sign_in,
)
from tests.slackapp.slack_server import FakeSlack
from tests.support.sagadata import Writer
from tests.support.waiting import wait_until

pytestmark = pytest.mark.e2e


def _drifted_check(server: LiveServer, handler: str) -> tuple[str, str]:
    """A refund compensated by its saga's rollback, which the observer finds still charged: drift.
    Returns (saga id, check id)."""
    writer = Writer()
    saga_id = f"e2e-drift-{uuid.uuid4().hex[:8]}"
    step = {"saga_id": saga_id, "step_id": f"{saga_id}-s1", "tool": "shop.charge"}
    compensation = {
        "fn": "refund",
        "handler": handler,
        "recoverable": True,
        "description": "",
        "idempotency_key": f"idem-{saga_id}",
        "kwargs": {"charge_id": "ch_e2e"},
    }
    server.ship(
        f"e2e-{saga_id}",
        [
            writer.record("SAGA_START", saga_id=saga_id, name="checkout"),
            writer.record("STEP_INTENT", **step, semantics="COMPENSABLE", kwargs={"amount": 42}),
            writer.record("STEP_COMMITTED", **step, semantics="COMPENSABLE", compensation=compensation),
            writer.record("ROLLBACK_START", saga_id=saga_id, steps=1),
            writer.record("COMPENSATED", **step, attempts=1, idempotency_key=f"idem-{saga_id}"),
            writer.record(
                "ROLLBACK_END",
                saga_id=saga_id,
                clean=True,
                compensated=1,
                failed=0,
                orphaned=0,
                unresolved=0,
                halted=False,
            ),
            writer.record("SAGA_ABORTED", saga_id=saga_id, clean=True),
        ],
    )
    check = claim_offered(server, handler)
    assert check["saga_id"] == saga_id, check
    answered = api_call(
        server,
        "POST",
        f"reconciliation/checks/{check['id']}/report",
        json={"token": check["token"], "reversed": False, "detail": "charge ch_e2e still captured"},
    )
    assert answered.status_code == 200, answered.text
    assert answered.json()["status"] == "drift"
    return saga_id, check["id"]


def test_the_reconciliation_page_reopens_a_drift_verdict(new_page, control_plane: LiveServer) -> None:
    handler = f"e2e.refund_{uuid.uuid4().hex[:6]}"
    saga_id, check_id = _drifted_check(control_plane, handler)
    page = new_page(height=1400)
    blocked = csp_watched(page)
    sign_in(page, OWNER)
    page.goto("/reconciliation/")
    row = page.locator(f'#drift-table tr[data-check="{check_id}"]')
    expect(row).to_contain_text(saga_id)
    expect(row).to_contain_text("still captured")
    row.get_by_role("button", name="Check again").click()
    expect(page.get_by_text(f"Re-opened: the observers of {handler} will be asked again.")).to_be_visible()
    expect(page.locator(f'#drift-table tr[data-check="{check_id}"]')).to_have_count(0)
    expect(page.locator(f'tr[data-check="{check_id}"]')).to_have_count(1)  # among the open checks
    screenshot(page, "flows-reconciliation-recheck")
    # Stored: the check is open again, offered to its observers once more (a decided one is not).
    again = claim_offered(control_plane, handler)
    assert again["id"] == check_id and again["status"] == "claimed", again
    assert blocked == []


# ----------------------------------------------------------------------------------------- Slack


def _install_slack(page, fake_slack: FakeSlack) -> None:  # type: ignore[no-untyped-def]
    page.goto("/integrations/slack/")
    page.get_by_role("link", name="Add to Slack").click()
    expect(page.locator("#consent")).to_be_visible()
    page.get_by_role("link", name="Allow").click()
    expect(page.get_by_text(f"Slack installed in {fake_slack.team_name}")).to_be_visible()


@pytest.fixture
def slack_installed(new_page, control_plane: LiveServer, fake_slack: FakeSlack) -> Iterator[Any]:
    """The owner's page with Slack installed through its consent page; uninstalled afterwards
    (the install test expects to find it uninstalled)."""
    page = new_page()
    blocked = csp_watched(page)
    sign_in(page, OWNER)
    _install_slack(page, fake_slack)
    try:
        yield page, blocked
    finally:
        page.goto("/integrations/slack/")
        uninstall = page.get_by_role("button", name="Uninstall")
        if uninstall.count():
            uninstall.click()
            expect(page.get_by_role("link", name="Add to Slack")).to_be_visible()


def _slash_command(server: LiveServer, slack: FakeSlack, user: str) -> str:
    """A signed `/saga-status` from `user`, answered through its response URL: the answer's text."""
    hook = f"/hooks/e2e-{uuid.uuid4().hex[:10]}"
    body = urlencode(
        {
            "command": "/saga-status",
            "text": "",
            "team_id": slack.team_id,
            "user_id": user,
            "channel_id": "C0RISK",
            "response_url": slack.url + hook,
        }
    ).encode()
    headers = {k.removeprefix("HTTP_").replace("_", "-"): v for k, v in slack.sign(body).items()}
    answer = httpx.post(
        f"{server.url}/slack/commands",
        content=body,
        headers={**headers, "Content-Type": "application/x-www-form-urlencoded"},
        timeout=30,
    )
    assert answer.status_code == 200, answer.text
    found = wait_until(
        lambda: [c for c in slack.called("response_url") if c.params.get("path") == hook],
        f"an answer to {user}'s command",
    )
    return str(found[0].params["text"])


def test_a_slack_user_links_their_account_from_slack_and_unlinks_it(
    slack_installed: Any, control_plane: LiveServer, fake_slack: FakeSlack
) -> None:
    page, blocked = slack_installed
    slack_user = f"U0E2E{uuid.uuid4().hex[:6].upper()}"
    # An unlinked Slack user's command decides nothing: Slack shows them a link to link themselves.
    unlinked = _slash_command(control_plane, fake_slack, slack_user)
    assert "not linked" in unlinked
    match = re.search(r"<(http[^|>]+)\|Link it>", unlinked)
    assert match is not None, unlinked
    page.goto(match.group(1))
    expect(page.locator("#slack-link")).to_contain_text(slack_user)
    expect(page.locator("#slack-link")).to_contain_text(fake_slack.team_name)
    page.get_by_role("button", name="Link this Slack account to me").click()
    expect(page.locator("#slack-linked")).to_contain_text(slack_user)
    screenshot(page, "flows-slack-linked")
    # Stored: the same command from Slack is now the owner's.
    linked = _slash_command(control_plane, fake_slack, slack_user)
    assert "not linked" not in linked, linked

    # Opened again, the page offers to unlink instead.
    page.goto(match.group(1))
    page.get_by_role("button", name="Unlink my Slack account instead").click()
    expect(page.get_by_text("Your Slack account is unlinked.")).to_be_visible()
    assert "not linked" in _slash_command(control_plane, fake_slack, slack_user)
    assert blocked == []


# ----------------------------------------------------------------------------------- break-glass


def test_an_owner_breaks_glass_on_a_pending_request(new_page, control_plane: LiveServer) -> None:
    page = new_page(height=1400)
    blocked = csp_watched(page)
    sign_in(page, OWNER)
    page.goto("/approvals/policies/")
    form = page.locator("#policy-form")
    form.get_by_label("Name", exact=True).fill("e2e wires")
    form.get_by_label("Tools (glob)").fill("e2e.wire.*")
    form.get_by_role("button", name="Create policy").click()
    expect(page.get_by_text("Approval policy 'e2e wires' created.")).to_be_visible()
    try:
        asked = api_call(
            control_plane,
            "POST",
            "gate/evaluate",
            json={
                "saga_id": f"e2e-glass-{uuid.uuid4().hex[:8]}",
                "step_id": "1",
                "tool": "e2e.wire.send",
                "args": {"amount": 90000, "to": "hospital"},
                "agent": "wire-bot",
            },
        )
        assert asked.status_code == 200, asked.text
        assert asked.json()["decision"] == "pending_approval"
        approval_id = asked.json()["approval_id"]

        page.goto(f"/approvals/{approval_id}/")
        expect(page.locator("#approval-action")).to_have_attribute("data-status", "pending")
        page.locator("#break-glass-heading").click()
        page.get_by_label("Reason (required)").fill("patient transfer cannot wait")
        page.get_by_role("button", name="Break glass and approve").click()
        expect(page.get_by_text("Break-glass approval recorded: approved.")).to_be_visible()
        expect(page.locator("#approval-action")).to_have_attribute("data-status", "approved")
        expect(page.locator("#approval-state")).to_contain_text("break-glass")
        expect(page.locator("#approval-state")).to_contain_text("patient transfer cannot wait")
        screenshot(page, "flows-break-glass")
        # Stored: approved, and listed for review.
        stored = api_call(control_plane, "GET", f"approvals/{approval_id}")
        assert stored.status_code == 200, stored.text
        assert stored.json()["status"] == "approved", stored.json()
        page.goto("/approvals/history/")
        expect(page.locator("#break-glass-list")).to_contain_text("patient transfer cannot wait")
    finally:
        page.goto("/approvals/policies/")
        page.get_by_role("button", name="Delete e2e wires").click()
        confirm_dialog(page, "Delete the policy e2e wires?")
        expect(page.locator('#policies-table tr[data-policy="e2e wires"]')).to_have_count(0)
    assert blocked == []
