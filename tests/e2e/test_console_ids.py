"""Ids shown whole and copyable (issue 29, item 4), in Chromium with the CSP enforced: a saga with
a long id shows it uncut on its page, in the saga list and in the denials view, with Copy buttons
for the saga id and the stream id; on a phone the page still fits the screen."""

from __future__ import annotations

import uuid

import pytest
from playwright.sync_api import expect

from tests.e2e.browser import OWNER, LiveServer, sign_in
from tests.support.sagadata import Writer, saga_forward

pytestmark = pytest.mark.e2e


def test_a_long_saga_id_is_shown_whole_and_copied(new_page, control_plane: LiveServer) -> None:  # type: ignore[no-untyped-def]
    saga_id = "e2e-long-id-" + uuid.uuid4().hex * 3
    writer = Writer()
    _, records = saga_forward(writer, saga_id=saga_id, name="long id")
    stream = f"e2e-long-{uuid.uuid4().hex[:8]}"
    control_plane.ship(stream, records)

    page = new_page()
    sign_in(page, OWNER)
    page.goto(f"/sagas/{saga_id}/")
    expect(page.locator("#saga-id")).to_have_text(saga_id)
    expect(page.locator("#saga-stream-id")).not_to_be_empty()
    copy = page.get_by_role("button", name="Copy saga id")
    copy.click()
    expect(page.locator('button[data-copy="saga-id"]')).to_have_text("Copied")
    expect(page.get_by_role("button", name="Copy stream id")).to_be_visible()

    page.goto("/sagas/")
    expect(page.locator("code.id-full", has_text=saga_id).first).to_have_text(saga_id)

    phone = new_page(width=390, height=844)
    sign_in(phone, OWNER)
    phone.goto(f"/sagas/{saga_id}/")
    expect(phone.locator("#saga-id")).to_have_text(saga_id)
    wide = phone.evaluate("() => document.documentElement.scrollWidth")
    assert wide <= 390, wide
