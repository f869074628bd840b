"""Roles explained where an action is not offered (issue 29, item 7), in Chromium with the CSP
enforced: a viewer and an approver are told who sets budgets, policies and kill switches."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.e2e.browser import RISK, VIEWER, screenshot, sign_in

pytestmark = pytest.mark.e2e


def test_members_are_told_who_may_do_what_they_cannot(new_page) -> None:  # type: ignore[no-untyped-def]
    viewer = new_page()
    sign_in(viewer, VIEWER)
    viewer.goto("/fleet/")
    note = viewer.locator("#fleet-role-note")
    expect(note).to_contain_text("Budgets, rate limits and circuit breakers are set by owners and admins")
    expect(note).to_contain_text("kill switches are engaged and lifted by owners, admins and approvers")
    expect(note).to_contain_text("You are signed in as viewer")
    expect(viewer.locator("#gate-forms")).to_have_count(0)
    screenshot(viewer, "console-roles-viewer-fleet")
    viewer.goto("/approvals/policies/")
    policies = viewer.locator("#policies-role-note")
    expect(policies).to_contain_text("Approval policies are set by owners and admins")

    approver = new_page()
    sign_in(approver, RISK)
    approver.goto("/fleet/")
    expect(approver.locator("#fleet-role-note")).to_contain_text("set by owners and admins")
    expect(approver.locator("#fleet-role-note")).not_to_contain_text("kill switches")  # they engage them
