"""The dashboard's other flows in a real browser, where the pages' CSP is enforced: every form
here posts to its own origin and is redirected back (a CSP, a missing CSRF token or a broken
redirect shows up here, never in Django's test client). Membership: an invitation accepted by a
new person, who joins a second tenant, switches to it and signs out; the owner changes their role
and removes them. Fleet: a rate limit and a budget set and deleted. Approval policies: disabled,
enabled and deleted. Passkeys: registered, renamed and revoked. Recovery: a job that waits for a
human retried, resolved, its saga quarantined. Approvals: a request denied, shown in the history."""

from __future__ import annotations

import re
import uuid

import httpx
import pytest
from playwright.sync_api import expect

from tests.e2e.browser import (
    AUDITOR,
    CAROL,
    OWNER,
    PASSWORD,
    RISK,
    LiveServer,
    confirm_dialog,
    passkey_browser,
    register_passkey,
    screenshot,
    sign_in,
)
from tests.support.sagadata import Writer, saga_forward

pytestmark = pytest.mark.e2e


def _invite(page, email: str, role: str) -> str:  # type: ignore[no-untyped-def]
    """As the signed-in owner: the invitation link for `email` (Administration → Members)."""
    page.goto("/administration/members/")
    page.get_by_label("Email").fill(email)
    page.get_by_label("Role", exact=True).select_option(role)
    page.get_by_role("button", name="Create invitation link").click()
    link = page.locator("#invite-url")
    expect(link).to_contain_text("/invite/")
    return link.inner_text().strip()


def test_an_invited_person_joins_two_tenants_switches_signs_out_and_is_changed_and_removed(
    new_page, control_plane: LiveServer
) -> None:
    email = f"newbie-{uuid.uuid4().hex[:8]}@example.test"
    owner = new_page()
    sign_in(owner, OWNER)
    demo_link = _invite(owner, email, "viewer")

    # The invitee sets a password and lands in Demo Co as a viewer.
    newbie = new_page()
    newbie.goto(demo_link)
    expect(newbie.get_by_role("heading", name="Join Demo Co")).to_be_visible()
    newbie.get_by_label("Choose a password").fill(PASSWORD + "-newbie")
    newbie.get_by_label("Again").fill(PASSWORD + "-newbie")
    newbie.get_by_role("button", name="Create account and join").click()
    expect(newbie.get_by_role("button", name="Sign out")).to_be_visible()
    expect(newbie.locator(".who")).to_contain_text("viewer")

    # Bravo's owner invites the same person; signed in as them, they join with one click.
    carol = new_page()
    sign_in(carol, CAROL)
    bravo_link = _invite(carol, email, "auditor")
    newbie.goto(bravo_link)
    newbie.get_by_role("button", name="Join Bravo Logistics").click()
    expect(newbie.get_by_role("button", name="Sign out")).to_be_visible()

    # Two tenants: the switcher moves between them.
    switcher = newbie.get_by_label("Tenant")
    switcher.select_option(label="Bravo Logistics")
    newbie.get_by_role("button", name="Switch").click()
    expect(newbie.get_by_label("Tenant")).to_have_value("bravo")
    expect(newbie.locator(".who")).to_contain_text("auditor")
    newbie.get_by_label("Tenant").select_option(label="Demo Co")
    newbie.get_by_role("button", name="Switch").click()
    expect(newbie.locator(".who")).to_contain_text("viewer")
    screenshot(newbie, "flows-tenant-switch")

    # Signing out ends the session: the dashboard asks for a sign-in again.
    newbie.get_by_role("button", name="Sign out").click()
    newbie.goto("/sagas/")
    expect(newbie).to_have_url(re.compile(r"/login/\?next=/sagas/"))

    # The owner changes their role, then removes them.
    owner.goto("/administration/members/")
    row = owner.locator(f'#members-table tr[data-member="{email}"]')
    row.get_by_label(f"Role for {email}").select_option("approver")
    row.get_by_role("button", name="Change role").click()
    expect(owner.locator(f'#members-table tr[data-member="{email}"]')).to_contain_text("Approver")
    owner.locator(f'#members-table tr[data-member="{email}"]').get_by_role("button", name="Remove").click()
    confirm_dialog(owner, f"Remove {email} from")
    expect(owner.locator(f'#members-table tr[data-member="{email}"]')).to_have_count(0)
    screenshot(owner, "flows-members")


def test_a_rate_limit_and_a_budget_are_set_and_deleted_on_the_fleet_page(
    new_page, control_plane: LiveServer
) -> None:
    page = new_page(height=1400)
    sign_in(page, OWNER)
    page.goto("/fleet/")
    rate = page.locator("#rate-form")
    rate.get_by_label("Name").fill("e2e pace")
    rate.get_by_label("Tools (glob)").fill("e2e.mail.*")
    rate.get_by_label("At most (calls)").fill("60")
    rate.get_by_label("Per", exact=True).fill("1")
    rate.get_by_label("Window unit").select_option("min")
    rate.get_by_role("button", name="Set rate limit").click()
    expect(page.get_by_text("Rate limit 'e2e pace' set: at most 60 calls per")).to_be_visible()

    budget = page.locator("#budget-form")
    budget.get_by_label("Name").fill("e2e spend")
    budget.get_by_label("Tools (glob)").fill("e2e.pay.*")
    budget.get_by_label("At most").fill("1,000")
    budget.get_by_label("Per", exact=True).fill("1")
    budget.get_by_label("Window unit").select_option("h")
    budget.get_by_role("button", name="Set budget").click()
    expect(page.get_by_text("Budget 'e2e spend' set")).to_be_visible()
    expect(page.locator('[data-budget="e2e spend"]')).to_be_visible()

    page.get_by_role("button", name="Delete rate limit e2e pace").click()
    confirm_dialog(page, "Delete the rate limit 'e2e pace'?")
    expect(page.get_by_text("Rate limit 'e2e pace' deleted.")).to_be_visible()
    page.get_by_role("button", name="Delete budget e2e spend").click()
    confirm_dialog(page, "Delete the budget 'e2e spend'?")
    expect(page.get_by_text("Budget 'e2e spend' deleted.")).to_be_visible()
    expect(page.locator('[data-budget="e2e spend"]')).to_have_count(0)


def test_an_approval_policy_is_disabled_enabled_and_deleted(new_page, control_plane: LiveServer) -> None:
    page = new_page(height=1400)
    sign_in(page, OWNER)
    page.goto("/approvals/policies/")
    form = page.locator("#policy-form")
    form.get_by_label("Name", exact=True).fill("e2e refunds")
    form.get_by_label("Tools (glob)").fill("e2e.refund.*")
    form.get_by_role("button", name="Create policy").click()
    expect(page.get_by_text("Approval policy 'e2e refunds' created.")).to_be_visible()
    row = page.locator('#policies-table tr[data-policy="e2e refunds"]')
    expect(row).to_contain_text("enabled")
    row.get_by_role("button", name="Disable e2e refunds").click()
    expect(page.locator('#policies-table tr[data-policy="e2e refunds"]')).to_contain_text("disabled")
    page.locator('#policies-table tr[data-policy="e2e refunds"]').get_by_role(
        "button", name="Enable e2e refunds"
    ).click()
    expect(page.locator('#policies-table tr[data-policy="e2e refunds"]')).to_contain_text("enabled")
    page.get_by_role("button", name="Delete e2e refunds").click()
    confirm_dialog(page, "Delete the policy e2e refunds?", action="Delete e2e refunds")
    expect(page.locator('#policies-table tr[data-policy="e2e refunds"]')).to_have_count(0)


def test_a_passkey_is_registered_renamed_and_revoked(browser_instance, control_plane: LiveServer) -> None:
    context, page = passkey_browser(browser_instance, control_plane)
    try:
        sign_in(page, AUDITOR)
        register_passkey(page, "e2e laptop")
        row = page.locator('#passkeys-table tr[data-passkey="e2e laptop"]')
        row.get_by_label("New name for e2e laptop").fill("e2e desktop")
        row.get_by_role("button", name="Rename e2e laptop").click()
        renamed = page.locator('#passkeys-table tr[data-passkey="e2e desktop"]')
        expect(renamed).to_contain_text("active")
        renamed.get_by_role("button", name="Revoke e2e desktop").click()
        confirm_dialog(page, "Revoke e2e desktop? It will sign nothing from now on.")
        expect(page.locator('#passkeys-table tr[data-passkey="e2e desktop"]')).to_contain_text("revoked")
        screenshot(page, "flows-passkeys")
    finally:
        context.close()


def _escalate_the_next_job(server: LiveServer, app: str) -> dict:
    """A recovery worker claims `app`'s next job and reports it failed for good: it waits for a human."""
    headers = {"Authorization": f"Bearer {server.api_key}"}
    claimed = httpx.post(
        f"{server.url}/api/v1/recovery/claim",
        json={"handlers": [f"{app}.undo_reserve_stock"], "wait": 10},
        headers=headers,
        timeout=30,
    )
    assert claimed.status_code == 200, claimed.text
    job = claimed.json()["job"]
    assert job is not None
    failed = httpx.post(
        f"{server.url}/api/v1/recovery/jobs/{job['id']}/fail",
        json={"token": job["token"], "error": "PSP said no", "retryable": False},
        headers=headers,
        timeout=30,
    )
    assert failed.status_code == 200, failed.text
    return job


def _rolled_back_to_step_1(page, server: LiveServer, name: str, app: str) -> str:  # type: ignore[no-untyped-def]
    """A finished saga of `app`'s handlers, rolled back to step 1 from its page: one job, for step 2."""
    writer = Writer()
    saga_id, records = saga_forward(writer, name=name, handlers=app)
    records.append(writer.record("SAGA_COMPLETE", saga_id=saga_id, clean=True))
    server.ship(f"e2e-{name}", records)
    page.goto(f"/sagas/{saga_id}/")
    page.locator("#rollback-to-1").click()
    confirm_dialog(page, "Compensate every step after step 1, newest first")
    expect(page.locator("#saga-status")).to_have_attribute("data-status", "recovering")
    return saga_id


def test_the_recovery_page_retries_resolves_and_quarantines(new_page, control_plane: LiveServer) -> None:
    page = new_page(height=1400)
    sign_in(page, OWNER)
    app = f"e2e{uuid.uuid4().hex[:8]}"  # its own handlers: other tests' abandoned sagas are not its work
    saga_id = _rolled_back_to_step_1(page, control_plane, "recovery-page", app)
    job = _escalate_the_next_job(control_plane, app)
    assert job["saga_id"] == saga_id
    page.goto("/recovery/")
    row = page.locator(f'#human-queue tr[data-job="{job["id"]}"]')
    expect(row).to_contain_text("PSP said no")
    row.get_by_role("button", name="Retry").click()
    expect(page.get_by_text("goes back to the recovery workers")).to_be_visible()
    expect(page.locator(f'#human-queue tr[data-job="{job["id"]}"]')).to_have_count(0)

    again = _escalate_the_next_job(control_plane, app)
    page.goto("/recovery/")
    row = page.locator(f'#human-queue tr[data-job="{again["id"]}"]')
    row.get_by_label("Note").fill("refunded by hand in the PSP console")
    row.get_by_role("button", name="Mark resolved").click()
    expect(page.get_by_text(f"of {saga_id}.")).to_be_visible()
    expect(page.locator(f'#human-queue tr[data-job="{again["id"]}"]')).to_have_count(0)

    other = _rolled_back_to_step_1(page, control_plane, "recovery-quarantine", app)
    third = _escalate_the_next_job(control_plane, app)
    page.goto("/recovery/")
    row = page.locator(f'#human-queue tr[data-job="{third["id"]}"]')
    row.get_by_label("Reason").fill("fraud suspected")
    row.get_by_role("button", name="Quarantine saga").click()
    confirm_dialog(page, f"Quarantine {other}? Recovery stops")
    expect(page.get_by_text(f"Quarantined {other}")).to_be_visible()
    screenshot(page, "flows-recovery")


def test_an_approver_denies_a_request_and_history_shows_it(new_page, control_plane: LiveServer) -> None:
    owner = new_page(height=1400)
    sign_in(owner, OWNER)
    owner.goto("/approvals/policies/")
    form = owner.locator("#policy-form")
    form.get_by_label("Name", exact=True).fill("e2e payouts")
    form.get_by_label("Tools (glob)").fill("e2e.payout.*")
    form.get_by_role("button", name="Create policy").click()
    expect(owner.get_by_text("Approval policy 'e2e payouts' created.")).to_be_visible()
    # An agent asks the gate: the call waits for a human.
    asked = httpx.post(
        f"{control_plane.url}/api/v1/gate/evaluate",
        json={
            "saga_id": f"e2e-deny-{uuid.uuid4().hex[:8]}",
            "step_id": "1",
            "tool": "e2e.payout.send",
            "args": {"amount": 900, "to": "mallory"},
            "agent": "payout-bot",
        },
        headers={"Authorization": f"Bearer {control_plane.api_key}"},
        timeout=20,
    )
    assert asked.status_code == 200, asked.text
    assert asked.json()["decision"] == "pending_approval"
    approval_id = asked.json()["approval_id"]

    risk = new_page()
    sign_in(risk, RISK)
    risk.goto(f"/approvals/{approval_id}/")
    expect(risk.locator("#approval-action")).to_contain_text("mallory")
    risk.locator("#vote-form").get_by_label("Note (optional)").fill("not a customer of ours")
    risk.locator("#vote-form").get_by_role("button", name="Deny").click()
    expect(risk.locator("#approval-action")).to_have_attribute("data-status", "denied")
    risk.goto("/approvals/history/")
    expect(risk.locator(f'#approval-history-table tr[data-approval="{approval_id}"]')).to_have_attribute(
        "data-status", "denied"
    )
    screenshot(risk, "flows-approval-denied")
    owner.get_by_role("button", name="Delete e2e payouts").click()
    confirm_dialog(owner, "Delete the policy e2e payouts?")
    expect(owner.locator('#policies-table tr[data-policy="e2e payouts"]')).to_have_count(0)
