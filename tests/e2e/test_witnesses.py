"""Managing the log's witnesses on the Evidence page in a real browser: an owner adds one, sets
the quorum, sees a refused key explained, removes it; an auditor sees them but cannot change them."""

from __future__ import annotations

import uuid

import pytest
from playwright.sync_api import expect
from sagaplane import cosignature

from tests.e2e.browser import AUDITOR, OWNER, LiveServer, screenshot, sign_in

pytestmark = pytest.mark.e2e


def test_an_owner_adds_sets_the_quorum_and_removes_a_witness(new_page, control_plane: LiveServer) -> None:
    name = f"w-{uuid.uuid4().hex[:8]}"
    vkey = cosignature.generate_cosigner(f"witness.test/{name}").verifier.encode()
    page = new_page()
    sign_in(page, OWNER)
    page.goto("/evidence/")
    card = page.locator("#witnesses-card")
    expect(card.get_by_role("heading", name="Witnesses")).to_be_visible()
    form = card.locator("#witness-add")
    form.get_by_label("Name").fill(name)
    form.get_by_label("Submission URL").fill("http://127.0.0.1:9")
    form.get_by_label("Verifier key").fill("not-a-key")
    form.get_by_role("button", name="Add witness").click()
    expect(page.get_by_text("Witness not added: vkey:")).to_be_visible()
    form = page.locator("#witness-add")
    form.get_by_label("Name").fill(name)
    form.get_by_label("Submission URL").fill("http://127.0.0.1:9")
    form.get_by_label("Verifier key").fill(vkey)
    form.get_by_role("button", name="Add witness").click()
    expect(page.get_by_text(f"Witness {name} added")).to_be_visible()
    row = page.locator(f'tr[data-witness="{name}"]')
    expect(row).to_be_visible()
    quorum = page.locator("#witness-quorum-form")
    quorum.get_by_label("Quorum").fill("1")
    quorum.get_by_role("button", name="Set quorum").click()
    expect(page.locator("#witness-quorum")).to_have_text("1")
    screenshot(page, "witnesses-managed")
    page.get_by_role("button", name=f"Remove witness {name}").click()
    expect(page.get_by_text("Witness removed")).to_be_visible()
    expect(page.locator(f'tr[data-witness="{name}"]')).to_have_count(0)
    expect(page.locator("#witness-quorum")).to_have_text("0")  # lowered with the witness


def test_an_auditor_sees_the_witnesses_but_cannot_change_them(new_page, control_plane: LiveServer) -> None:
    page = new_page()
    sign_in(page, AUDITOR)
    page.goto("/evidence/")
    expect(page.locator("#witnesses-card").get_by_role("heading", name="Witnesses")).to_be_visible()
    expect(page.locator("#witness-add")).to_have_count(0)
    expect(page.locator("#witness-quorum-form")).to_have_count(0)
