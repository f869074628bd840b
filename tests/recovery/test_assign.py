"""Acknowledge / assign a job that needs a human (issue 29, item 4): a member who may decide
recovery takes it up (names themself) or hands it to another such member, or to nobody; each change
is recorded with its old and new assignee, in the same transaction; refused inputs change nothing."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from core.scoping import tenant_context
from recovery.models import Job, JobState
from tenants.models import Role
from tests.recovery.sagas import crashed, sweep_later
from tests.support.chains import Writer, server_stream
from tests.support.factories import Person, make_person

pytestmark = pytest.mark.django_db


@pytest.fixture
def waiting(alice: Person) -> Job:
    crashed(Writer(alice.tenant, "agent-a-1"), "wire", steps=2, semantics="IRREVERSIBLE", last="STEP_UNKNOWN")
    sweep_later(alice.tenant)
    with tenant_context(alice.tenant):
        return Job.objects.get(saga_id="wire", state=JobState.ESCALATED)


def _assigned(person: Person, job: Job) -> tuple[str, Any]:
    with tenant_context(person.tenant):
        fresh = Job.objects.get(pk=job.pk)
    return fresh.assignee, fresh.assigned_at


def test_the_api_assigns_and_records_old_and_new(alice: Person, bob: Person, waiting: Job) -> None:
    risk = make_person(alice.tenant, "rita", Role.APPROVER)
    api = alice.session_client()
    url = f"/api/v1/recovery/jobs/{waiting.pk}/assign"
    me = alice.user.get_username()
    taken = api.post(url, {"assignee": me}, format="json")
    assert taken.status_code == 200 and taken.json()["assignee"] == me and taken.json()["assigned_at"]
    handed = api.post(url, {"assignee": risk.user.get_username()}, format="json")
    assert handed.status_code == 200 and handed.json()["assignee"] == risk.user.get_username()
    records = [r for r in server_stream(alice.tenant) if r["event"] == "RECOVERY_ASSIGNED"]
    assert [(r["old"]["assignee"], r["new"]["assignee"]) for r in records] == [
        ("", me),
        (me, risk.user.get_username()),
    ]
    assert records[0]["actor"] == f"user:{me}" and records[0]["job_id"] == str(waiting.pk)
    # Refused: a viewer (may not decide recovery), a stranger, a non-string, a huge name.
    for body, status in [
        ({"assignee": bob.user.get_username()}, 400),
        ({"assignee": "nobody@elsewhere.example"}, 400),
        ({"assignee": 7}, 400),
        ({"assignee": "x" * 5000}, 400),
        ({}, 400),
        ([], 400),
    ]:
        response = api.post(url, body, format="json")
        assert response.status_code == status, (body, response.content)
        assert set(response.json()) >= {"error", "detail", "field"}
    assert _assigned(alice, waiting)[0] == risk.user.get_username()
    assert bob.session_client().post(url, {"assignee": ""}, format="json").status_code == 403
    assert (
        api.post("/api/v1/recovery/jobs/not-a-uuid/assign", {"assignee": ""}, format="json").status_code
        == 404
    )
    cleared = api.post(url, {"assignee": ""}, format="json")
    assert cleared.status_code == 200 and _assigned(alice, waiting) == ("", None)


def test_a_finished_job_cannot_be_assigned(alice: Person, waiting: Job) -> None:
    api = alice.session_client()
    api.post(f"/api/v1/recovery/jobs/{waiting.pk}/resolve", {"note": "dealt with"}, format="json")
    refused = api.post(
        f"/api/v1/recovery/jobs/{waiting.pk}/assign", {"assignee": alice.user.get_username()}, format="json"
    )
    assert refused.status_code == 409 and refused.json()["error"] == "not_escalated"


def test_the_page_acknowledges_and_assigns(alice: Person, bob: Person, carol: Person, waiting: Job) -> None:
    owner = Client()
    owner.force_login(alice.user)
    page = owner.get("/recovery/").content.decode()
    assert "Nobody yet" in page and "Acknowledge: I take it" in page
    response = owner.post(f"/recovery/jobs/{waiting.pk}/assign", {"assignee": alice.user.get_username()})
    assert response.status_code == 302
    assert _assigned(alice, waiting)[0] == alice.user.get_username()
    page = owner.get("/recovery/").content.decode()
    assert "Nobody yet" not in page and "<strong>You</strong>" in page
    viewer = Client()
    viewer.force_login(bob.user)
    assert viewer.post(f"/recovery/jobs/{waiting.pk}/assign", {"assignee": ""}).status_code == 403
    assert "Assign to" not in viewer.get("/recovery/").content.decode()
    outsider = Client()
    outsider.force_login(carol.user)
    assert outsider.post(f"/recovery/jobs/{waiting.pk}/assign", {"assignee": ""}).status_code == 404
    assert _assigned(alice, waiting)[0] == alice.user.get_username()
