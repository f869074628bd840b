"""The saga timeline as risk staff read it (issue 29, item 4), in Chromium with the CSP enforced:
found by pasting its id (keyboard only), the agent by name, absolute times and durations, the
cause and the rollback's report as sentences, and a refused call in the step list; another tenant
finds nothing."""

from __future__ import annotations

import re
import uuid

import pytest
from playwright.sync_api import expect

from tests.e2e.browser import CAROL, OWNER, LiveServer, screenshot, sign_in
from tests.support.sagadata import Writer, saga_forward, saga_rollback

pytestmark = pytest.mark.e2e
UTC_TIME = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC")


def test_a_saga_found_by_id_tells_its_story(new_page, control_plane: LiveServer) -> None:  # type: ignore[no-untyped-def]
    writer = Writer()
    saga_id = f"e2e-story-{uuid.uuid4().hex[:8]}"
    _, forward = saga_forward(writer, saga_id=saga_id, name="checkout", agent="checkout-bot")
    denied = writer.record(
        "GATE_DENY",
        saga_id=saga_id,
        step_id=f"{saga_id}-s9",
        tool="bank.wire",
        semantics="IRREVERSIBLE",
        kwargs={"amount": 100},
        reason="halted",
        answer={"decision": "deny", "reason": "halted"},
    )
    records = [*forward, denied, *saga_rollback(writer, saga_id)]
    control_plane.ship(f"e2e-story-{uuid.uuid4().hex[:6]}", records)

    page = new_page()
    sign_in(page, OWNER)
    page.goto("/sagas/")
    page.get_by_label("Saga id").focus()
    page.keyboard.type(f"  {saga_id} ")
    page.keyboard.press("Enter")
    expect(page).to_have_url(f"/sagas/{saga_id}/")
    expect(page.locator("#saga-agent")).to_contain_text("checkout-bot")
    expect(page.locator(".saga-summary .abs-time").first).to_have_text(UTC_TIME)
    steps = page.locator("#forward-steps > li")
    expect(steps).to_have_count(4)  # three steps that ran (the third failed), the call refused
    expect(steps.nth(0).locator(".step-duration")).to_be_visible()
    expect(page.locator('#forward-steps li.refused-step[data-tool="bank.wire"]')).to_contain_text(
        "Refused by the gate"
    )
    expect(page.locator("#abort-cause")).to_contain_text("mail server down")
    expect(page.locator("#rollback-report")).to_contain_text("Rollback ended clean")
    expect(page.locator("#rollback-report")).to_contain_text("2 compensated")
    screenshot(page, "console-saga-timeline")

    page.goto("/sagas/")
    page.get_by_label("Saga id").fill("no-such-saga")
    page.get_by_role("button", name="Go to saga").click()
    expect(page.get_by_text("No saga with the id “no-such-saga”.")).to_be_visible()

    carol = new_page()
    sign_in(carol, CAROL)
    carol.goto(f"/sagas/find?saga_id={saga_id}")
    expect(carol).to_have_url("/sagas/")
    expect(carol.get_by_text(f"No saga with the id “{saga_id}”.")).to_be_visible()
    assert carol.request.get(f"/sagas/{saga_id}/").status == 404
