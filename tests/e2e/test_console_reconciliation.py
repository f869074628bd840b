"""The Reconciliation page paged (issue 29, item 5), in Chromium with the CSP enforced: a saga
whose rollback compensated 55 charges opens 55 checks; the owner walks the "Waiting for an
observer" list a page at a time (Next, Previous, from the keyboard), sees every check once, and
reads each compensation's arguments as values (not Python reprs)."""

from __future__ import annotations

import uuid

import pytest
from playwright.sync_api import expect

from tests.e2e.browser import OWNER, LiveServer, claim_offered, csp_watched, screenshot, sign_in
from tests.support.sagadata import Writer

pytestmark = pytest.mark.e2e
CHARGES = 55


def _many_compensated(server: LiveServer, handler: str) -> str:
    writer = Writer()
    saga_id = f"e2e-many-{uuid.uuid4().hex[:8]}"
    records = [writer.record("SAGA_START", saga_id=saga_id, name="checkout")]
    steps = []
    for n in range(CHARGES):
        step = {"saga_id": saga_id, "step_id": f"{saga_id}-s{n}", "tool": "shop.charge"}
        compensation = {
            "fn": "refund",
            "handler": handler,
            "recoverable": True,
            "description": "",
            "idempotency_key": f"idem-{saga_id}-{n}",
            "kwargs": {"charge_id": f"ch_{n}", "note": None},
        }
        records.append(writer.record("STEP_INTENT", **step, semantics="COMPENSABLE", kwargs={"n": n}))
        records.append(
            writer.record("STEP_COMMITTED", **step, semantics="COMPENSABLE", compensation=compensation)
        )
        steps.append(step)
    records.append(writer.record("ROLLBACK_START", saga_id=saga_id, steps=CHARGES))
    for n, step in reversed(list(enumerate(steps))):
        records.append(
            writer.record("COMPENSATED", **step, attempts=1, idempotency_key=f"idem-{saga_id}-{n}")
        )
    records.append(
        writer.record(
            "ROLLBACK_END",
            saga_id=saga_id,
            clean=True,
            compensated=CHARGES,
            failed=0,
            orphaned=0,
            unresolved=0,
            halted=False,
        )
    )
    records.append(writer.record("SAGA_ABORTED", saga_id=saga_id, clean=True))
    server.ship(f"e2e-{saga_id}", records)
    return saga_id


def test_the_reconciliation_lists_page_forward_and_back(new_page, control_plane: LiveServer) -> None:  # type: ignore[no-untyped-def]
    handler = f"e2e.refund_{uuid.uuid4().hex[:6]}"
    saga_id = _many_compensated(control_plane, handler)
    claim_offered(control_plane, handler)  # scanned: its checks are open (one now claimed by this "observer")
    page = new_page(height=1400)
    blocked = csp_watched(page)
    sign_in(page, OWNER)
    page.goto("/reconciliation/")
    page.get_by_role("link", name="Waiting for an observer").click()
    expect(page).to_have_url("/reconciliation/?show=open")
    ours = f'#open-table tr[data-saga="{saga_id}"]'
    seen: list[list[str]] = []
    while True:
        rows = page.locator("#open-table tbody tr")
        expect(rows.first).to_be_visible()
        assert rows.count() <= 50
        seen.append([r.get_attribute("data-check") or "" for r in page.locator(ours).all()])
        following = page.get_by_role("link", name="Next ›")
        if following.count() == 0:
            break
        following.focus()
        page.keyboard.press("Enter")
    found = [check for batch in seen for check in batch]
    assert len(found) == CHARGES and len(set(found)) == CHARGES  # each check once, none skipped
    assert len(seen) >= 2
    page.get_by_role("link", name="‹ Previous").click()
    again = [r.get_attribute("data-check") for r in page.locator(ours).all()]
    assert again == seen[-2]
    row = page.locator(ours).first
    expect(row.locator("dl.args")).to_contain_text("charge_id")
    expect(row.locator("dl.args")).to_contain_text("none")  # `note=None`, read as a value
    expect(row).not_to_contain_text("=None")
    screenshot(page, "console-reconciliation-paged")
    assert blocked == []
