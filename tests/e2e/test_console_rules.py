"""Rules without JSON (issue 29, item 2), in Chromium with the CSP enforced: an approval policy built
row by row, previewed against the demo's calls of the last day, saved, edited into its next
version and read in its history with what changed; every new page passes axe with no serious
violation."""

from __future__ import annotations

import re
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.e2e.browser import AXE, OWNER, RUN_AXE, SERIOUS, screenshot, sign_in

pytestmark = pytest.mark.e2e


def _csp_watched(page: Any) -> list[str]:
    blocked: list[str] = []
    page.on("console", lambda m: blocked.append(m.text) if "Content Security Policy" in m.text else None)
    return blocked


def _serious(page: Any) -> list[str]:
    page.evaluate(AXE.read_text(encoding="utf-8"))
    violations = page.evaluate(RUN_AXE)
    return [f"{v['id']} ({v['impact']}): {v['nodes']}" for v in violations if v["impact"] in SERIOUS]


def test_a_policy_is_built_previewed_edited_and_its_history_read(new_page) -> None:  # type: ignore[no-untyped-def]
    page = new_page(height=1400)
    blocked = _csp_watched(page)
    sign_in(page, OWNER)
    page.goto("/approvals/policies/")
    form = page.locator("#policy-form")
    form.get_by_label("Name", exact=True).fill("e2e card charges")
    form.get_by_label("Tools (glob)").fill("charge_card")
    form.get_by_label("Argument of condition 1").fill("amount_cents")
    form.get_by_label("Operator of condition 1").select_option(label="is at least")
    form.get_by_label("Value of condition 1").fill("1")
    form.get_by_role("button", name="Add a condition").click()
    # The row added; what was typed stays.
    form = page.locator("#policy-form")
    expect(form.get_by_label("Value of condition 1")).to_have_value("1")
    form.get_by_label("Argument of condition 2").fill("amount_cents")
    form.get_by_label("Operator of condition 2").select_option(label="is at most")
    form.get_by_label("Value of condition 2").fill("10,000,000")
    form.get_by_role("button", name="Add an escalation level").click()
    form = page.locator("#policy-form")
    form.get_by_label("After (minutes) for level 1").fill("20")
    form.get_by_role("group", name="Roles of level 1").get_by_label("owner").check()

    # The preview: the demo agent's charges of the last day would all have needed approval.
    form.get_by_role("button", name="Preview matches").click()
    preview = page.locator("#policy-preview")
    expect(preview).to_contain_text(
        re.compile(r"Would match: [1-9][0-9]* of [1-9][0-9]* calls? in the last 24 hours")
    )
    expect(page.locator("#preview-examples li").first).to_contain_text("charge_card")
    assert _serious(page) == []
    screenshot(page, "rules-policy-preview")

    page.locator("#policy-form").get_by_role("button", name="Create policy").click()
    expect(page.get_by_text("Approval policy 'e2e card charges' created.")).to_be_visible()
    row = page.locator('#policies-table tr[data-policy="e2e card charges"]')
    expect(row).to_contain_text("amount_cents is at least 1 and amount_cents is at most 10000000")
    expect(row).to_contain_text("decide in 60 min")
    try:
        # Edit: the rows come back as saved; saving makes version 2.
        row.get_by_role("link", name="Edit e2e card charges").click()
        form = page.locator("#policy-form")
        expect(form.get_by_label("Value of condition 2")).to_have_value("10000000")
        expect(form.get_by_label("After (minutes) for level 1")).to_have_value("20")
        assert _serious(page) == []
        form.get_by_label("Value of condition 1").fill("5000")
        form.get_by_label("Approvals required").fill("2")
        form.get_by_role("button", name="Remove condition 2").click()
        form = page.locator("#policy-form")
        expect(form.get_by_label("Argument of condition 2")).to_have_count(0)
        expect(form.get_by_label("Value of condition 1")).to_have_value("5000")  # as typed
        form.get_by_role("button", name="Save as a new version").click()
        expect(page.get_by_text("Approval policy 'e2e card charges' saved as version 2.")).to_be_visible()

        # The history: both versions, who and when, and what version 2 changed, as text.
        expect(page.get_by_role("heading", name="History of e2e card charges")).to_be_visible()
        latest = page.locator('#policy-versions li[data-version="2"]')
        expect(latest).to_contain_text("owner@demo.sagaplane.local")
        when = latest.locator('tr[data-term="When"]')
        expect(when.locator(".diff-old")).to_contain_text(
            "amount_cents is at least 1 and amount_cents is at most"
        )
        expect(when.locator(".diff-new")).to_contain_text("amount_cents is at least 5000")
        needs = latest.locator('tr[data-term="Approvals required"]')
        expect(needs.locator(".diff-old")).to_contain_text("1")
        expect(needs.locator(".diff-new")).to_contain_text("2")
        expect(page.locator('#policy-versions li[data-version="1"]')).to_contain_text(
            "Created with these terms"
        )
        assert _serious(page) == []
        screenshot(page, "rules-policy-history")
    finally:
        # The session's server is shared: no other test's charges may wait for this policy.
        page.goto("/approvals/policies/")
        page.locator('#policies-table tr[data-policy="e2e card charges"]').get_by_role(
            "button", name="Disable e2e card charges"
        ).click()
        expect(page.locator('#policies-table tr[data-policy="e2e card charges"]')).to_contain_text("disabled")
    assert blocked == []


def test_a_rule_with_a_group_is_built_previewed_saved_and_opens_as_it_was(new_page) -> None:  # type: ignore[no-untyped-def]
    page = new_page(height=1400)
    blocked = _csp_watched(page)
    sign_in(page, OWNER)
    page.goto("/approvals/policies/")
    form = page.locator("#policy-form")
    form.get_by_label("Name", exact=True).fill("e2e grouped charges")
    form.get_by_label("Tools (glob)").fill("charge_card")
    # (amount_cents at least 1 and at most 10,000,000) or currency one of XTS: a group, then a row.
    form.get_by_role("button", name="Add a group").click()
    form = page.locator("#policy-form")
    form.get_by_role("button", name="Remove condition 1").click()  # the blank row above the group
    form = page.locator("#policy-form")
    form.get_by_label("Argument of condition 1").fill("amount_cents")
    form.get_by_label("Operator of condition 1").select_option(label="is at least")
    form.get_by_label("Value of condition 1").fill("1")
    form.get_by_role("button", name="Add a condition to group 1").click()
    form = page.locator("#policy-form")
    expect(form.get_by_label("Value of condition 1")).to_have_value("1")  # as typed
    form.get_by_label("Argument of condition 2").fill("amount_cents")
    form.get_by_label("Operator of condition 2").select_option(label="is at most")
    form.get_by_label("Value of condition 2").fill("10,000,000")
    form.get_by_label("Group 1 holds when").select_option(label="all of these hold")
    form.get_by_role("button", name="Add a condition", exact=True).click()
    form = page.locator("#policy-form")
    form.get_by_label("Condition 3 joins the one above with").select_option("or")
    form.get_by_label("Argument of condition 3").fill("currency")
    form.get_by_label("Operator of condition 3").select_option(label="is one of")
    form.get_by_label("Value of condition 3").fill("XTS")
    rule = "((amount_cents is at least 1 and amount_cents is at most 10000000) or currency is one of XTS)"

    form.get_by_role("button", name="Preview matches").click()
    preview = page.locator("#policy-preview")
    expect(preview).to_contain_text(
        re.compile(r"Would match: [1-9][0-9]* of [1-9][0-9]* calls? in the last 24 hours")
    )
    expect(preview).to_contain_text(rule)
    expect(page.locator("#preview-examples li").first).to_contain_text("charge_card")
    assert _serious(page) == []
    screenshot(page, "rules-policy-group-preview")

    page.locator("#policy-form").get_by_role("button", name="Create policy").click()
    expect(page.get_by_text("Approval policy 'e2e grouped charges' created.")).to_be_visible()
    row = page.locator('#policies-table tr[data-policy="e2e grouped charges"]')
    try:
        expect(row).to_contain_text(rule)
        row.get_by_role("link", name="Edit e2e grouped charges").click()
        form = page.locator("#policy-form")
        expect(form.locator(".builder-group")).to_have_count(1)
        expect(form.get_by_label("Group 1 holds when")).to_have_value("all")
        expect(form.get_by_label("Value of condition 2")).to_have_value("10000000")
        expect(form.get_by_label("Condition 3 joins the one above with")).to_have_value("or")
        expect(page.locator("#kept-predicates")).to_have_count(0)
        assert _serious(page) == []
        screenshot(page, "rules-policy-group-edit")
    finally:
        # The session's server is shared: no other test's charges may wait for this policy.
        page.goto("/approvals/policies/")
        page.locator('#policies-table tr[data-policy="e2e grouped charges"]').get_by_role(
            "button", name="Disable e2e grouped charges"
        ).click()
        expect(page.locator('#policies-table tr[data-policy="e2e grouped charges"]')).to_contain_text(
            "disabled"
        )
    assert blocked == []


def test_a_budget_and_a_rate_limit_are_edited_from_their_forms(new_page) -> None:  # type: ignore[no-untyped-def]
    page = new_page(height=1400)
    blocked = _csp_watched(page)
    sign_in(page, OWNER)
    page.goto("/fleet/")
    budget = page.locator("#budget-form")
    budget.get_by_label("Name").fill("e2e rules spend")
    budget.get_by_label("Tools (glob)").fill("e2e.rules.pay.*")
    budget.get_by_label("At most").fill("1,000")
    budget.get_by_label("Per", exact=True).fill("1")
    budget.get_by_label("Window unit").select_option("h")
    budget.get_by_role("button", name="Set budget").click()
    expect(page.get_by_text("Budget 'e2e rules spend' set")).to_be_visible()

    # Edit: the form comes back in the units it was asked in; a hostile cap is refused beside it.
    page.get_by_role("link", name="Edit budget e2e rules spend").click()
    form = page.locator("#budget-form")
    expect(form.get_by_label("At most")).to_have_value("1000")
    expect(form.get_by_label("Per", exact=True)).to_have_value("1")
    expect(form.get_by_label("Window unit")).to_have_value("h")
    assert _serious(page) == []
    form.get_by_label("At most").fill("-7")
    form.get_by_role("button", name="Save budget").click()
    expect(page.locator("#b-max-total-error")).to_be_visible()
    form = page.locator("#budget-form")
    form.get_by_label("At most").fill("2,500")
    form.get_by_label("Per", exact=True).fill("30")
    form.get_by_label("Window unit").select_option("min")
    form.get_by_label("each agent").check()
    form.get_by_role("button", name="Save budget").click()
    expect(
        page.get_by_text("Budget 'e2e rules spend' saved: at most 2,500 of amount per 30 minutes")
    ).to_be_visible()
    expect(page.locator('[data-budget="e2e rules spend"]')).to_contain_text("for agent")

    rate = page.locator("#rate-form")
    rate.get_by_label("Name").fill("e2e rules pace")
    rate.get_by_label("Tools (glob)").fill("e2e.rules.mail.*")
    rate.get_by_label("At most (calls)").fill("60")
    rate.get_by_label("Per", exact=True).fill("1")
    rate.get_by_label("Window unit").select_option("min")
    rate.get_by_role("button", name="Set rate limit").click()
    expect(page.get_by_text("Rate limit 'e2e rules pace' set")).to_be_visible()
    page.get_by_role("link", name="Edit rate limit e2e rules pace").click()
    form = page.locator("#rate-form")
    expect(form.get_by_label("At most (calls)")).to_have_value("60")
    assert _serious(page) == []
    form.get_by_label("At most (calls)").fill("12")
    form.get_by_role("button", name="Save rate limit").click()
    expect(
        page.get_by_text("Rate limit 'e2e rules pace' saved: at most 12 calls per 1 minute")
    ).to_be_visible()
    screenshot(page, "rules-limits-edited")
    assert blocked == []
