"""The console's rough edges (issue 29, item 6), each checked where a person meets it: in Chromium,
with the pages' CSP enforced. The navigation fits one line at 1280 px, no page logs an error for
a missing icon, signing out lands on the sign-in page, the approvals' pages answer with and
without their trailing slash (a checkbox beside its label: test_slack.py)."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.e2e.browser import OWNER, screenshot, sign_in

pytestmark = pytest.mark.e2e


def _console_errors(page) -> list[str]:  # type: ignore[no-untyped-def]
    """Every error the page reports on its console (a failed load included), as the test goes."""
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("requestfailed", lambda r: errors.append(f"failed: {r.url}"))
    page.on("response", lambda r: errors.append(f"{r.status}: {r.url}") if r.status >= 400 else None)
    return errors


def test_the_owners_navigation_fits_one_line_at_1280_px_and_no_page_logs_an_error(new_page) -> None:  # type: ignore[no-untyped-def]
    page = new_page(width=1280, height=800)
    errors = _console_errors(page)
    sign_in(page, OWNER)
    for path in ("/", "/sagas/", "/fleet/", "/approvals/", "/evidence/", "/administration/members/"):
        # Until what the page fetches as it loads has answered (the fleet page asks for its
        # controls at once): leaving sooner would abort that request, which is not a page error.
        page.goto(path, wait_until="networkidle")
        tops = page.locator(".topbar .mainnav li").evaluate_all(
            "items => items.map(item => Math.round(item.getBoundingClientRect().top))"
        )
        assert len(tops) >= 6, tops  # the owner sees every section
        assert len(set(tops)) == 1, (path, tops)  # one line: no item wrapped below the others
        account = page.locator(".topbar .account").bounding_box()
        first = page.locator(".topbar .mainnav li").first.bounding_box()
        assert account is not None and first is not None
        assert abs(account["y"] - first["y"]) < first["height"], (path, account, first)
    screenshot(page, "console-navigation-1280")
    # The icon the pages name is served (and a browser asking /favicon.ico is sent to it).
    icon = page.locator("link[rel=icon]").get_attribute("href")
    assert icon and page.request.get(icon).status == 200
    assert page.request.get("/favicon.ico").ok
    assert errors == [], errors


def test_sign_out_lands_on_the_sign_in_page(new_page) -> None:  # type: ignore[no-untyped-def]
    page = new_page()
    sign_in(page, OWNER)
    page.get_by_role("button", name="Sign out").click()
    expect(page).to_have_url("/login/")
    expect(page.get_by_label("Email")).to_be_visible()
    page.goto("/sagas/")  # signed out indeed: the dashboard asks to sign in again
    expect(page).to_have_url("/login/?next=/sagas/")


def test_approvals_pages_answer_with_and_without_their_slash(new_page) -> None:  # type: ignore[no-untyped-def]
    page = new_page()
    sign_in(page, OWNER)
    for asked, shown in (
        ("/approvals/history", "/approvals/history/"),
        ("/approvals/history/", "/approvals/history/"),
        ("/approvals/policies", "/approvals/policies/"),
        ("/approvals/policies/", "/approvals/policies/"),
    ):
        answer = page.goto(asked)
        assert answer is not None and answer.ok, (asked, answer and answer.status)
        expect(page).to_have_url(shown)
        expect(page.locator("h1")).to_be_visible()
