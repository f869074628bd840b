"""The dashboard in a real browser against a real server (daphne, websockets, the ingest API)."""

from __future__ import annotations

import re
import subprocess
import sys

import httpx
import pytest
from playwright.sync_api import expect

from frontend.fleet_chart import BARS_PER_LANE, SLOTS
from frontend.saga_views import PAGE_SIZE
from tests.e2e.browser import (
    AUDITOR,
    CAROL,
    LIVE_TIMEOUT,
    OWNER,
    VIEWER,
    LiveServer,
    confirm_dialog,
    screenshot,
    sign_in,
    wait_live,
)
from tests.support.sagadata import Writer, saga_forward, saga_rollback
from tests.support.waiting import wait_until

pytestmark = pytest.mark.e2e


def test_sign_in_and_the_empty_state(new_page, control_plane: LiveServer) -> None:
    page = new_page()
    page.goto("/sagas/")
    expect(page).to_have_url(re.compile(r"/login/\?next=/sagas/"))
    screenshot(page, "01-sign-in")
    sign_in(page, OWNER)
    expect(page.get_by_role("heading", name="Sagas", exact=True)).to_be_visible()
    nav = page.get_by_role("navigation", name="Main")
    for label in ("Sagas", "Fleet", "Evidence", "Administration"):
        expect(nav.get_by_role("link", name=label)).to_be_visible()


def test_saga_appears_live_and_rolls_back_live(new_page, control_plane: LiveServer) -> None:
    page = new_page()
    sign_in(page, OWNER)
    page.goto("/sagas/")
    wait_live(page)
    writer = Writer()
    saga_id, records = saga_forward(writer, name="live-checkout")
    control_plane.ship("e2e-live", records)
    row = page.locator(f'tr[data-saga="{saga_id}"]')
    expect(row).to_be_visible(timeout=LIVE_TIMEOUT)
    expect(row).to_have_attribute("data-status", "running")
    expect(row.get_by_text("running", exact=True)).to_be_visible()
    # No reload happened: a marker set on the window survives only without navigation.
    page.evaluate("window.__noReload = true")
    control_plane.ship("e2e-live", saga_rollback(writer, saga_id))
    expect(row).to_have_attribute("data-status", "rolled_back", timeout=LIVE_TIMEOUT)
    expect(row.get_by_text("rolled back", exact=True)).to_be_visible()
    assert page.evaluate("window.__noReload") is True
    screenshot(page, "02-sagas-list")


def test_older_and_newer_page_through_the_list_in_the_browser(new_page, control_plane: LiveServer) -> None:
    writer = Writer()
    ids: list[str] = []
    records: list[dict] = []
    for n in range(PAGE_SIZE + 10):
        saga_id, forward = saga_forward(writer, saga_id=f"e2e-page-{n:03d}")
        ids.append(saga_id)
        records += forward
    control_plane.ship("e2e-pages", records)
    newest = ids[::-1]  # shipped oldest first, each active after the one before
    page = new_page()
    sign_in(page, OWNER)
    page.goto("/sagas/?stream=e2e-pages")
    listed = page.locator("#sagas-table tbody tr")
    expect(listed).to_have_count(PAGE_SIZE)
    assert listed.evaluate_all("rows => rows.map(r => r.dataset.saga)") == newest[:PAGE_SIZE]
    expect(page.get_by_role("link", name="‹ Newer")).to_have_count(0)
    page.get_by_role("link", name="Older ›").click()
    expect(listed).to_have_count(10)
    assert listed.evaluate_all("rows => rows.map(r => r.dataset.saga)") == newest[PAGE_SIZE:]
    expect(page).to_have_url(re.compile(r"stream=e2e-pages.*cursor=|cursor=.*stream=e2e-pages"))
    expect(page.get_by_role("link", name="Older ›")).to_have_count(0)
    page.get_by_role("link", name="‹ Newer").click()
    expect(listed).to_have_count(PAGE_SIZE)
    assert listed.evaluate_all("rows => rows.map(r => r.dataset.saga)") == newest[:PAGE_SIZE]
    screenshot(page, "02b-sagas-pages")


def test_detail_shows_compensations_in_reverse_and_updates_live(new_page, control_plane: LiveServer) -> None:
    writer = Writer()
    saga_id, records = saga_forward(writer, name="detail-checkout")
    control_plane.ship("e2e-detail", records)
    page = new_page()
    sign_in(page, OWNER)
    page.goto(f"/sagas/{saga_id}/")
    expect(page.locator("#saga-status")).to_have_attribute("data-status", "running")
    wait_live(page)
    control_plane.ship("e2e-detail", saga_rollback(writer, saga_id, fail_last=True))
    expect(page.locator("#saga-status")).to_have_attribute(
        "data-status", "rollback_partial", timeout=LIVE_TIMEOUT
    )
    forward = page.locator("#forward-steps > li")
    backward = page.locator("#compensations > li")
    expect(forward).to_have_count(3)
    expect(backward).to_have_count(2)
    assert [forward.nth(i).get_attribute("data-tool") for i in range(3)] == [
        "charge_card",
        "reserve_stock",
        "send_invoice",
    ]
    assert [backward.nth(i).get_attribute("data-tool") for i in range(2)] == ["reserve_stock", "charge_card"]
    expect(backward.nth(0).locator(".outcome")).to_have_text("Compensated")
    expect(backward.nth(1).locator(".outcome")).to_have_text("Compensation failed")
    # The inspector opens by keyboard and shows the chain hash and leaf index.
    summary = forward.nth(0).locator("summary").first
    summary.focus()
    page.keyboard.press("Enter")
    inspector = forward.nth(0).locator(".inspector")
    expect(inspector).to_be_visible()
    expect(inspector.locator(".chain-hash").first).to_have_text(re.compile(r"^[0-9a-f]{64}$"))
    expect(inspector.locator(".leaf-index").first).to_have_text(re.compile(r"^\d+$"))
    expect(inspector).to_contain_text("undo_charge_card")
    screenshot(page, "03-saga-detail")


def test_viewer_cannot_see_the_api_key_page(new_page, control_plane: LiveServer) -> None:
    page = new_page()
    sign_in(page, VIEWER)
    nav = page.get_by_role("navigation", name="Main")
    expect(nav.get_by_role("link", name="Sagas")).to_be_visible()
    expect(nav.get_by_role("link", name="Administration")).to_have_count(0)
    expect(nav.get_by_role("link", name="Evidence")).to_have_count(0)
    response = page.goto("/administration/keys/")
    assert response is not None and response.status == 403
    expect(page.get_by_role("heading", name="Not allowed")).to_be_visible()
    expect(page.locator("#keys-table")).to_have_count(0)
    screenshot(page, "04-viewer-forbidden")


def test_tenant_b_sees_nothing_of_a_by_url_guessing(new_page, control_plane: LiveServer) -> None:
    writer = Writer()
    saga_id, records = saga_forward(writer, name="secret-acme-saga")
    control_plane.ship("demo-private-stream", records)
    page = new_page()
    sign_in(page, CAROL)
    for path in (f"/sagas/{saga_id}/", f"/sagas/{saga_id}/timeline"):
        response = page.goto(path)
        assert response is not None and response.status == 404, path
    for path in (
        "/sagas/",
        "/sagas/?stream=demo-private-stream",
        "/fleet/",
        "/evidence/",
        "/administration/members/",
        "/administration/keys/",
    ):
        page.goto(path)
        body = page.content()
        for fingerprint in (saga_id, "secret-acme-saga", "Demo Co", OWNER, "e2e-agent"):
            assert fingerprint not in body, (path, fingerprint)
    page.goto("/sagas/")
    expect(page.locator("#no-sagas")).to_be_visible()
    screenshot(page, "10-other-tenant-empty")


def test_owner_creates_a_key_in_the_browser_and_an_agent_uses_it(new_page, control_plane: LiveServer) -> None:
    page = new_page()
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    sign_in(page, OWNER)
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Administration").click()
    expect(page.locator("#members-table")).to_contain_text(VIEWER)
    screenshot(page, "05-members")
    page.get_by_role("link", name="API keys").click()
    page.get_by_label("Name").fill("browser-made")
    page.get_by_role("button", name="Create key").click()
    key = page.locator("#new-key-value").inner_text().strip()
    assert key.startswith("sp_")
    page.get_by_role("button", name="Copy key").click()
    expect(page.get_by_role("button", name="Copied")).to_be_visible()
    assert page.evaluate("navigator.clipboard.readText()") == key
    screenshot(page, "06-api-key-created")
    writer = Writer()
    _, records = saga_forward(writer, name="with-browser-key")
    response = httpx.post(
        f"{control_plane.url}/api/v1/streams/browser-key/records",
        json={"records": records},
        headers={"Authorization": f"Bearer {key}"},
        timeout=20,
    )
    assert response.status_code == 200, response.text
    page.goto("/administration/keys/")
    row = page.locator("#keys-table tr", has_text="browser-made")
    expect(row).not_to_contain_text("never")  # last used is now set
    row.get_by_role("button", name=re.compile("Revoke")).click()
    confirm_dialog(page, "Revoke browser-made? Agents using it stop working at once.")
    expect(page.locator("#keys-table tr", has_text="browser-made")).to_contain_text("revoked")


def test_fleet_evidence_and_phone_width(new_page, control_plane: LiveServer) -> None:
    writer = Writer()
    for _ in range(3):
        saga_id, records = saga_forward(writer, name="fleet-saga", agent="fleet-bot")
        control_plane.ship("e2e-fleet", records + saga_rollback(writer, saga_id))
    # A busy lane: past BARS_PER_LANE sagas it is drawn as columns linking to the filtered list.
    busy, records = Writer(), []
    for n in range(BARS_PER_LANE + 5):
        records += saga_forward(busy, saga_id=f"e2e-busy-{n:03d}", name="busy-saga")[1]
    control_plane.ship("e2e-busy", records)
    page = new_page()
    sign_in(page, AUDITOR)
    page.goto("/fleet/")
    expect(page.locator("#fleet-chart .lane-row[data-stream='e2e-fleet']")).to_be_visible()
    expect(page.locator("#fleet-chart .rollback-mark").first).to_be_visible()
    expect(page.locator("#outcome-matrix")).to_be_visible()
    columns = page.locator("#fleet-chart .lane-row[data-stream='e2e-busy'] a.bar-link")
    assert 1 <= columns.count() <= SLOTS
    screenshot(page, "07-fleet")
    columns.first.click()
    expect(page).to_have_url(re.compile(r"/sagas/\?stream=e2e-busy&status=running"))
    expect(page.locator("#sagas-table tr[data-saga^='e2e-busy-']").first).to_be_visible()
    page.goto("/evidence/")
    fleet_row = page.locator("#streams-table tr[data-stream='e2e-fleet']")
    expect(fleet_row.locator(".stream-agent")).to_have_text("fleet-bot")
    screenshot(page, "08-evidence")
    phone = new_page(width=390, height=844)
    sign_in(phone, OWNER)
    phone.goto("/sagas/")
    expect(phone.locator("#sagas-table")).to_be_visible()
    # Nothing wider than the screen: no horizontal scrolling of the page.
    assert phone.evaluate("document.documentElement.scrollWidth") <= 390 + 1
    screenshot(phone, "09-sagas-phone")


def test_keyboard_reaches_navigation_with_visible_focus(new_page, control_plane: LiveServer) -> None:
    page = new_page()
    sign_in(page, OWNER)
    page.goto("/sagas/")
    page.keyboard.press("Tab")
    expect(page.locator(".skip-link")).to_be_focused()
    page.keyboard.press("Tab")
    page.keyboard.press("Tab")
    focused = page.locator(":focus")
    expect(focused).to_have_text("Sagas")
    outline = focused.evaluate("el => getComputedStyle(el).outlineStyle")
    assert outline not in ("none", "")


def reloaded_until(page, path: str, selector: str, what: str) -> None:  # type: ignore[no-untyped-def]
    """Load `path` again until `selector` is on it (what a worker adds in its own time)."""

    def shown() -> bool:
        page.goto(path)
        return bool(page.locator(selector).count())

    wait_until(shown, what, deadline=60, every=0.5)


def test_export_started_completes_and_verifies_with_the_sdk(
    new_page, control_plane: LiveServer, tmp_path
) -> None:
    writer = Writer()
    saga_id, records = saga_forward(writer, name="exported-saga")
    control_plane.ship("e2e-export", records)
    page = new_page()
    sign_in(page, AUDITOR)
    # A running saga is not sealed: its page says when its disclosure can be had, and links none.
    page.goto(f"/sagas/{saga_id}/")
    expect(page.get_by_text("a disclosure can be downloaded once the saga is sealed")).to_be_visible()
    expect(page.locator("#disclosure-link")).to_have_count(0)
    control_plane.ship("e2e-export", saga_rollback(writer, saga_id))
    # The worker's integrator signs a checkpoint about a second after ingest: reload until it shows.
    reloaded_until(page, "/evidence/", "#checkpoint-size", "a signed checkpoint")
    key = page.locator("#verifier-key").inner_text().strip()
    page.get_by_role("button", name="Start an export").click()
    newest = page.locator("#exports > li").first
    expect(newest).to_have_attribute("data-status", "done", timeout=60_000)
    screenshot(page, "11-evidence-export")
    with page.expect_download() as download_info:
        newest.get_by_role("link", name="Download export (tar.gz)").click()
    archive = tmp_path / "export.tar.gz"
    download_info.value.save_as(archive)
    result = subprocess.run(
        [sys.executable, "-m", "sagaplane", "verify-export", str(archive), "--key", key],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    # Once the rolled-back saga is sealed (by the worker), its disclosure downloads from its page
    # too, and verifies with the same key.
    reloaded_until(page, f"/sagas/{saga_id}/", "#disclosure-link", "the sealed saga's disclosure link")
    with page.expect_download() as disclosure_info:
        page.locator("#disclosure-link").click()
    bundle = tmp_path / "disclosure.json"
    disclosure_info.value.save_as(bundle)
    result = subprocess.run(
        [sys.executable, "-m", "sagaplane", "verify-disclosure", str(bundle), "--key", key],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
