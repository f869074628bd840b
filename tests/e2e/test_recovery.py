"""Recovery in a real browser: "Rollback to here" on a finished saga's timeline queues the later
steps for the recovery workers, and the timeline shows their compensations live, newest first.
The worker here is the HTTP API a `sagaplane worker` speaks (claim, complete with its token)."""

from __future__ import annotations

import re
import uuid

import httpx
import pytest
from playwright.sync_api import expect

from tests.e2e.browser import (
    LIVE_TIMEOUT,
    OWNER,
    VIEWER,
    LiveServer,
    confirm_dialog,
    screenshot,
    sign_in,
    wait_live,
)
from tests.support.sagadata import Writer, saga_forward

pytestmark = pytest.mark.e2e


def _work_one(server: LiveServer, app: str) -> dict | None:
    """One claim of `app`'s compensations and its completion, as a recovery worker does."""
    headers = {"Authorization": f"Bearer {server.api_key}"}
    handlers = [f"{app}.undo_charge_card", f"{app}.undo_reserve_stock", f"{app}.undo_send_invoice"]
    claimed = httpx.post(
        f"{server.url}/api/v1/recovery/claim",
        json={"handlers": handlers, "wait": 5},
        headers=headers,
        timeout=20,
    )
    assert claimed.status_code == 200, claimed.text
    job = claimed.json()["job"]
    if job is not None:
        done = httpx.post(
            f"{server.url}/api/v1/recovery/jobs/{job['id']}/complete",
            json={"token": job["token"]},
            headers=headers,
            timeout=20,
        )
        assert done.status_code == 200, done.text
    return job


def test_rollback_to_here_runs_live_on_the_timeline(new_page, control_plane: LiveServer) -> None:
    writer = Writer()
    app = f"e2e{uuid.uuid4().hex[:8]}"  # its own handlers: other tests' abandoned sagas are not its work
    saga_id, records = saga_forward(writer, name="rollback-here", handlers=app)
    records.append(writer.record("SAGA_COMPLETE", saga_id=saga_id, clean=True))
    control_plane.ship("e2e-rollback-here", records)

    viewer = new_page()
    sign_in(viewer, VIEWER)
    viewer.goto(f"/sagas/{saga_id}/")
    expect(viewer.locator("#forward-steps > li")).to_have_count(2)
    expect(viewer.locator("#rollback-to-1")).to_have_count(0)  # viewers may look, not decide

    page = new_page()
    sign_in(page, OWNER)
    page.goto(f"/sagas/{saga_id}/")
    expect(page.locator("#saga-status")).to_have_attribute("data-status", "completed")
    expect(page.locator("#rollback-to-2")).to_have_count(0)  # nothing after the last step
    page.locator("#rollback-to-1").click()
    confirm_dialog(page, "Compensate every step after step 1, newest first")
    expect(page.locator("#saga-status")).to_have_attribute("data-status", "recovering", timeout=LIVE_TIMEOUT)
    jobs = page.locator("#recovery-jobs > li")
    expect(jobs).to_have_count(1)
    expect(jobs.first).to_have_attribute("data-recovery-state", "pending")
    wait_live(page)

    job = _work_one(control_plane, app)
    assert job is not None and job["saga_id"] == saga_id and job["step"] == 2
    assert job["handler"] == f"{app}.undo_reserve_stock"
    # Without a reload: the compensation and the end of the run arrive as records.
    expect(page.locator("#saga-status")).to_have_attribute("data-status", "rolled_back", timeout=LIVE_TIMEOUT)
    expect(jobs.first).to_have_attribute("data-recovery-state", "compensated")
    backward = page.locator("#compensations > li")
    expect(backward).to_have_count(1)
    expect(backward.first).to_have_attribute("data-tool", "reserve_stock")
    expect(page.locator('#forward-steps > li[data-tool="charge_card"] .outcome').first).to_have_text(
        "Committed"
    )
    screenshot(page, "recovery-rollback-to-here")
    assert _work_one(control_plane, app) is None  # step 1 was kept: nothing else to do


def test_an_open_saga_page_turns_orphaned_when_its_lease_lapses(new_page, control_plane: LiveServer) -> None:
    """Time passing is no record: the page fetches itself again at the lease's expiry, so a dead
    agent's saga is never left showing `running` (issue 23)."""
    writer = Writer()
    saga_id = "lapsing-lease"
    step = {"saga_id": saga_id, "step_id": f"{saga_id}-s1", "tool": "charge_card", "semantics": "COMPENSABLE"}
    control_plane.ship(
        "e2e-lapsing",
        [
            writer.record("SAGA_START", saga_id=saga_id, name="lapsing", lease_ttl=20),
            writer.record("STEP_INTENT", **step),
            writer.record("STEP_COMMITTED", **step),
        ],
    )
    page = new_page()
    sign_in(page, OWNER)
    page.goto(f"/sagas/{saga_id}/")
    expect(page.locator("#saga-status")).to_have_attribute("data-status", "running")
    note = page.locator("#orphan-note")
    expect(note).to_have_attribute("data-phase", re.compile("starting|started"), timeout=45_000)
    expect(note).to_contain_text("orphaned — recovery")
    expect(page.locator("#saga-status")).not_to_have_attribute("data-status", "running")
