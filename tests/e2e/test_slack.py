"""Slack's install in a real browser, where the pages' CSP is enforced: "Add to Slack" leads to
the consent page of the local Slack stand-in, on another origin (a form posted to the server and
redirected there was blocked by `form-action 'self'`: the button did nothing in Chromium); "Allow"
brings the owner back, installed; the channel is chosen, e-mail matching turned on, and Slack
uninstalled, all on the page. "Cancel" on Slack's page installs nothing. A Slack user links
themselves to a member through the link they are sent, and is listed by their Slack name."""

from __future__ import annotations

import uuid
from urllib.parse import urlsplit

import httpx
import pytest
from playwright.sync_api import expect

from tests.e2e.browser import OWNER, LiveServer, screenshot, sign_in
from tests.slackapp.slack_server import FakeSlack
from tests.support.slack import command_body
from tests.support.waiting import wait_until

pytestmark = pytest.mark.e2e


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def test_add_to_slack_reaches_the_consent_page_on_another_origin_and_installs(
    new_page, control_plane: LiveServer, fake_slack: FakeSlack
) -> None:
    assert _origin(fake_slack.url) != control_plane.url  # the consent page is cross-origin
    page = new_page()
    blocked: list[str] = []
    page.on("console", lambda m: blocked.append(m.text) if "Content Security Policy" in m.text else None)
    sign_in(page, OWNER)
    page.goto("/integrations/slack/")
    response = page.request.get(control_plane.url + "/integrations/slack/")
    assert "form-action 'self'" in response.headers["content-security-policy"]

    # The control: a form to the consent page (what the install was) is refused by the CSP here.
    consent = page.get_by_role("link", name="Add to Slack").get_attribute("href")
    assert consent is not None and _origin(consent) == fake_slack.url
    asked = len(fake_slack.called("oauth/v2/authorize"))  # the stand-in is shared by the session
    with page.expect_console_message(lambda m: "form-action" in m.text):
        page.evaluate(
            """url => { const f = document.createElement("form"); f.method = "get"; f.action = url;
                        document.body.appendChild(f); f.submit(); }""",
            consent,
        )
    assert page.url == control_plane.url + "/integrations/slack/"
    assert len(fake_slack.called("oauth/v2/authorize")) == asked
    page.goto("/integrations/slack/")  # a fresh page (the refused submission leaves one pending)

    # Cancel first: back on the settings page, nothing installed.
    page.get_by_role("link", name="Add to Slack").click()
    expect(page.locator("#consent")).to_contain_text(fake_slack.team_name)
    assert _origin(page.url) == fake_slack.url
    page.get_by_role("link", name="Cancel").click()
    expect(page.get_by_text("Slack install cancelled.")).to_be_visible()
    expect(page.get_by_role("link", name="Add to Slack")).to_be_visible()

    page.get_by_role("link", name="Add to Slack").click()
    expect(page.locator("#consent")).to_be_visible()
    screenshot(page, "slack-consent")
    page.get_by_role("link", name="Allow").click()
    expect(page).to_have_url(control_plane.url + "/integrations/slack/")
    expect(page.get_by_text(f"Slack installed in {fake_slack.team_name}")).to_be_visible()
    expect(page.locator("#slack-team")).to_contain_text(fake_slack.team_id)

    page.get_by_label("Channel for approval requests").select_option("C0RISK")
    page.get_by_role("button", name="Use this channel").click()
    expect(page.get_by_text("Approval requests go to #risk-approvals.")).to_be_visible()
    expect(page.locator("#slack-channel")).to_have_text("#risk-approvals")
    matching = page.get_by_label("Match Slack users to members by their e-mail address")
    matching.check()
    # The box sits beside its words (it was a full-width input, a line away from them).
    box_at = matching.bounding_box()
    label_at = page.locator("label", has=matching).bounding_box()
    assert box_at is not None and label_at is not None
    assert box_at["width"] < 40, box_at
    assert label_at["y"] <= box_at["y"] <= label_at["y"] + label_at["height"], (box_at, label_at)
    page.get_by_role("button", name="Save").click()
    expect(page.get_by_text("E-mail matching is on.")).to_be_visible()
    screenshot(page, "slack-installed")

    page.get_by_role("button", name="Uninstall").click()
    expect(page.get_by_text("Slack uninstalled")).to_be_visible()
    expect(page.get_by_role("link", name="Add to Slack")).to_be_visible()
    assert len(blocked) == 1 and "form-action" in blocked[0]  # the control's, nothing else


def test_a_slack_user_links_themselves_and_the_slack_page_names_them(
    new_page, control_plane: LiveServer, fake_slack: FakeSlack
) -> None:
    """An unlinked Slack user's command is answered privately with a link; the member opens it,
    sees who asks (the name Slack shows for them), confirms, and the Slack page lists the link by
    that name beside the Slack id."""
    page = new_page()
    sign_in(page, OWNER)
    page.goto("/integrations/slack/")
    installed_here = bool(page.get_by_role("link", name="Add to Slack").count())
    if installed_here:
        page.get_by_role("link", name="Add to Slack").click()
        page.get_by_role("link", name="Allow").click()
        expect(page.get_by_text(f"Slack installed in {fake_slack.team_name}")).to_be_visible()
    try:
        _link_by_name(page, control_plane, fake_slack)
    finally:
        if installed_here:  # the shared tenant is left as found: other tests install Slack themselves
            page.goto("/integrations/slack/")
            page.get_by_role("button", name="Uninstall").click()
            expect(page.get_by_role("link", name="Add to Slack")).to_be_visible()


def _link_by_name(page, control_plane: LiveServer, fake_slack: FakeSlack) -> None:  # type: ignore[no-untyped-def]
    user = f"U0E2E{uuid.uuid4().hex[:6].upper()}"
    fake_slack.users[user] = {"id": user, "name": "eve", "profile": {"display_name": "Eve Example"}}
    answered_before = len(fake_slack.called("response_url"))
    body = command_body(fake_slack, "/saga-status", "", user=user)
    signature = {k.removeprefix("HTTP_").replace("_", "-"): v for k, v in fake_slack.sign(body).items()}
    answer = httpx.post(
        f"{control_plane.url}/slack/commands",
        content=body,
        headers={**signature, "Content-Type": "application/x-www-form-urlencoded"},
        timeout=20,
    )
    assert answer.status_code == 200, answer.text

    def link_reply() -> str:
        texts = [str(c.params.get("text", "")) for c in fake_slack.called("response_url")[answered_before:]]
        return next((text for text in texts if "/integrations/slack/link/" in text), "")

    reply = wait_until(link_reply, "the private answer with the link", deadline=60)
    link = reply[reply.index("/integrations/slack/link/") : reply.index("|")]
    page.goto(link)
    expect(page.locator("#slack-name")).to_have_text("Eve Example")
    page.locator("#slack-link-confirm").click()
    expect(page.locator("#slack-linked")).to_contain_text("Eve Example")
    page.goto("/integrations/slack/")
    expect(page.locator(".slack-link", has_text=user)).to_contain_text("Eve Example")
    screenshot(page, "slack-linked-by-name")
