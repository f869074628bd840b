"""The Recovery page's lists are paged (issue 29, item 5), in Chromium with the CSP enforced: 52
partial rollbacks (each needs a human) fill more than one page of 50; "Next ›" under the list
shows the rest, "‹ Previous" goes back, and no saga is on two pages."""

from __future__ import annotations

import re
import uuid

import pytest
from playwright.sync_api import expect

from tests.e2e.browser import OWNER, LiveServer, screenshot, sign_in
from tests.support.sagadata import Writer

pytestmark = pytest.mark.e2e
SAGAS = 52


def _partial_rollbacks(server: LiveServer) -> list[str]:
    writer, records, ids = Writer(), [], []
    run = uuid.uuid4().hex[:6]
    for n in range(SAGAS):
        saga_id = f"e2e-partial-{run}-{n:02d}"
        step = {
            "saga_id": saga_id,
            "step_id": f"{saga_id}-s1",
            "tool": "ship_parcel",
            "semantics": "COMPENSABLE",
        }
        records += [
            writer.record("SAGA_START", saga_id=saga_id, name="partial", lease_ttl=300),
            writer.record("STEP_INTENT", **step, kwargs={"parcel": n}),
            writer.record("STEP_COMMITTED", **step),
            writer.record("ROLLBACK_START", saga_id=saga_id, steps=1),
            writer.record(
                "COMPENSATION_FAILED",
                **{k: step[k] for k in ("saga_id", "step_id", "tool")},
                error="courier down",
                attempts=3,
            ),
            writer.record(
                "ROLLBACK_END",
                saga_id=saga_id,
                clean=False,
                compensated=0,
                failed=1,
                orphaned=0,
                unresolved=0,
                halted=False,
            ),
            writer.record("SAGA_ABORTED", saga_id=saga_id, clean=False),
        ]
        ids.append(saga_id)
    server.ship(f"e2e-partial-{run}", records)
    return ids


def test_a_long_needs_a_human_list_pages_with_next_and_previous(new_page, control_plane: LiveServer) -> None:  # type: ignore[no-untyped-def]
    ours = set(_partial_rollbacks(control_plane))
    page = new_page(height=1200)
    sign_in(page, OWNER)
    page.goto("/recovery/")
    listed = page.locator("#partial-rollbacks > li")
    expect(listed).to_have_count(50)
    first = set(listed.evaluate_all("items => items.map(i => i.dataset.saga)"))
    pager = page.get_by_role("navigation", name="Pages of partial rollbacks")
    pager.get_by_role("link", name="Next ›").click()
    expect(page).to_have_url(re.compile(r"/recovery/\?partial_before=[^&]+#queue$"))
    expect(listed.first).to_be_visible()
    second = set(listed.evaluate_all("items => items.map(i => i.dataset.saga)"))
    screenshot(page, "console-recovery-paged")
    assert not first & second  # no saga on two pages
    assert ours <= first | second  # the newest first: ours fill the first pages
    pager.get_by_role("link", name="‹ Previous").click()
    expect(listed).to_have_count(50)
    assert set(listed.evaluate_all("items => items.map(i => i.dataset.saga)")) == first
