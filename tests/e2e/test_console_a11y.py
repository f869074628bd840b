"""The accessibility pass (issue 29): axe-core, vendored from the npm registry into
tests/e2e/vendor/axe-core, run in Chromium on every page of the owner's navigation and the new
console pages, and on a page with the confirmation dialog open, with the CSP enforced. Zero
serious or critical violations.

axe is evaluated through the DevTools protocol (`page.evaluate`), which the page's CSP does not
govern; nothing is added to the pages themselves."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.e2e.browser import AXE, OWNER, RUN_AXE, SERIOUS, sign_in
from tests.support.console import PAGES

pytestmark = pytest.mark.e2e


def test_no_page_has_a_serious_accessibility_violation(new_page) -> None:  # type: ignore[no-untyped-def]
    page = new_page()
    sign_in(page, OWNER)
    source = AXE.read_text(encoding="utf-8")
    found: dict[str, list[str]] = {}
    for path in PAGES:
        page.goto(path)
        page.evaluate(source)
        violations = page.evaluate(RUN_AXE)
        serious = [f"{v['id']} ({v['impact']}): {v['nodes']}" for v in violations if v["impact"] in SERIOUS]
        if serious:
            found[path] = serious
    assert found == {}, found


def test_the_confirmation_dialog_has_no_serious_accessibility_violation(new_page) -> None:  # type: ignore[no-untyped-def]
    page = new_page()
    sign_in(page, OWNER)
    page.goto("/administration/members/")
    page.locator("#members-table").get_by_role("button", name="Remove").first.click()
    dialog = page.locator("dialog#confirm-dialog")
    expect(dialog).to_be_visible()
    page.evaluate(AXE.read_text(encoding="utf-8"))
    violations = page.evaluate(RUN_AXE)
    serious = [f"{v['id']} ({v['impact']}): {v['nodes']}" for v in violations if v["impact"] in SERIOUS]
    assert serious == []
    dialog.get_by_role("button", name="Cancel").click()
    expect(dialog).to_be_hidden()
