"""A worker's complete, fail and heartbeat and a person's assign as typed inputs
(recovery/inputs.py): each refusal keeps its status, code, sentence and field, and the same
precedence as when the views and services checked the bodies by hand: a body that is not a JSON
object first, then a job id that is no UUID (404), then the fields in their old order, then the
job's lookup (404; for assign before the fields), then the job's state. Written against the
hand-parsed code first, and passing there."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from core.scoping import tenant_context
from recovery.models import Job, JobState
from tests.recovery.sagas import HANDLER, crashed, escalated_job, sweep_later
from tests.support.chains import Writer
from tests.support.factories import Person

pytestmark = pytest.mark.django_db

BODY = (400, "invalid", "the body must be a JSON object", "body")
NOT_FOUND = (404, "not_found", "no such recovery job", None)
TOKEN = (400, "invalid", "token: the integer the claim returned", "token")
ERROR = (400, "invalid", "error: a string of at most 2000 characters", "error")
RETRYABLE = (400, "invalid", "retryable: true or false", "retryable")
REASON = (400, "invalid", "reason: omit it, or 'no_handler'", "reason")
LEASE = (400, "invalid", "lease_s: seconds from 1 to 300", "lease_s")
ASSIGNEE = (400, "invalid", 'assignee: a member\'s username, or "" for nobody', "assignee")
NOT_ASSIGNABLE = (
    400,
    "not_assignable",
    "assignee: not a member of this tenant who may decide recovery",
    "assignee",
)


def _shape(answer: Any) -> tuple[int, str, str, str | None]:
    body = answer.json()
    return answer.status_code, body["error"], body["detail"], body.get("field")


@pytest.fixture
def claimed(alice: Person) -> tuple[APIClient, dict[str, Any]]:
    crashed(Writer(alice.tenant, "agent-a-1"), "s1", steps=1)
    sweep_later(alice.tenant)
    worker = alice.key_client()
    answer = worker.post("/api/v1/recovery/claim", {"handlers": [HANDLER]}, format="json")
    job = answer.json()["job"]
    assert job is not None
    return worker, job


def _post(client: APIClient, job_id: str, what: str, body: Any) -> Any:
    return client.post(f"/api/v1/recovery/jobs/{job_id}/{what}", body, format="json")


def _refusals(client: APIClient, job: dict[str, Any], what: str, cases: list[tuple[str, Any, Any]]) -> None:
    for where, body, expected in cases:
        job_id = {"job": job["id"], "missing": str(uuid.uuid4()), "no-uuid": "not-a-uuid"}[where]
        assert _shape(_post(client, job_id, what, body)) == expected, (what, where, body)


def _job(person: Person, job_id: str) -> Job:
    with tenant_context(person.tenant):
        return Job.objects.get(pk=job_id)


def test_complete_refuses_as_before(alice: Person, claimed: tuple[APIClient, dict[str, Any]]) -> None:
    worker, job = claimed
    stale = (
        409,
        "stale_token",
        f"this job's current token is not {job['token'] + 1} (it was claimed again, or already "
        "finished): nothing was recorded",
        "token",
    )
    _refusals(
        worker,
        job,
        "complete",
        [
            ("no-uuid", [1], BODY),  # the body before the path
            ("no-uuid", {"token": "x"}, NOT_FOUND),  # the path before the fields
            ("job", {}, TOKEN),
            ("job", {"token": None}, TOKEN),
            ("job", {"token": "1"}, TOKEN),
            ("job", {"token": True}, TOKEN),
            ("job", {"token": 1.0}, TOKEN),
            ("missing", {"token": "1"}, TOKEN),  # the token before the lookup
            ("missing", {"token": 1}, NOT_FOUND),
            ("job", {"token": job["token"] + 1}, stale),
        ],
    )
    assert _job(alice, job["id"]).state == JobState.CLAIMED
    done = _post(worker, job["id"], "complete", {"token": job["token"]})
    assert (done.status_code, done.json()) == (200, {"id": job["id"], "state": "compensated"})


def test_fail_refuses_as_before(alice: Person, claimed: tuple[APIClient, dict[str, Any]]) -> None:
    worker, job = claimed
    token = job["token"]
    _refusals(
        worker,
        job,
        "fail",
        [
            ("no-uuid", "x", BODY),
            ("no-uuid", {"error": 5}, NOT_FOUND),
            ("job", {"error": 5, "retryable": "x", "reason": "x", "token": "x"}, ERROR),
            ("job", {"error": "e" * 2001, "token": token}, ERROR),
            ("job", {"error": "a\x00b", "token": token}, ERROR),
            ("job", {"retryable": 1, "reason": "x", "token": "x"}, RETRYABLE),
            ("job", {"retryable": None, "token": token}, RETRYABLE),
            ("job", {"reason": "other", "token": "x"}, REASON),
            ("job", {"reason": "", "token": token}, REASON),
            ("job", {"error": "boom"}, TOKEN),
            ("missing", {"error": 5, "token": 1}, ERROR),  # the fields before the lookup
            ("missing", {"token": 1}, NOT_FOUND),
        ],
    )
    assert _job(alice, job["id"]).state == JobState.CLAIMED
    failed = _post(worker, job["id"], "fail", {"token": token, "error": None, "reason": None})
    assert (failed.status_code, failed.json()["state"]) == (200, "pending")  # retried: attempts remain
    assert _job(alice, job["id"]).last_error == ""


def test_fail_without_a_handler_escalates(alice: Person, claimed: tuple[APIClient, dict[str, Any]]) -> None:
    worker, job = claimed
    body = {"token": job["token"], "error": "no such handler", "retryable": True, "reason": "no_handler"}
    failed = _post(worker, job["id"], "fail", body)
    assert (failed.status_code, failed.json()["state"]) == (200, "escalated")
    assert _job(alice, job["id"]).last_error == "no such handler"


def test_heartbeat_refuses_as_before(alice: Person, claimed: tuple[APIClient, dict[str, Any]]) -> None:
    worker, job = claimed
    token = job["token"]
    _refusals(
        worker,
        job,
        "heartbeat",
        [
            ("no-uuid", [1], BODY),
            ("no-uuid", {"lease_s": 0}, NOT_FOUND),
            ("job", {"lease_s": 0, "token": "x"}, LEASE),
            ("job", {"lease_s": 300.5, "token": token}, LEASE),
            ("job", {"lease_s": "5", "token": token}, LEASE),
            ("job", {"lease_s": True, "token": token}, LEASE),
            ("job", {"lease_s": None}, TOKEN),
            ("missing", {"lease_s": 0, "token": 1}, LEASE),
            ("missing", {"token": 1}, NOT_FOUND),
        ],
    )
    for lease_s, seconds in [(300, 300), (1.5, 1.5), (None, 30)]:
        before = timezone.now()
        beat = _post(worker, job["id"], "heartbeat", {"token": token, "lease_s": lease_s})
        assert (beat.status_code, beat.json()["state"]) == (200, "claimed")
        expires = _job(alice, job["id"]).lease_expires_at
        assert expires is not None
        assert before + timedelta(seconds=seconds) <= expires <= timezone.now() + timedelta(seconds=seconds)


def test_assign_refuses_as_before(alice: Person, claimed: tuple[APIClient, dict[str, Any]]) -> None:
    api = alice.session_client()
    waiting = {"id": str(escalated_job(alice.tenant).pk)}
    busy = claimed[1]  # claimed by a worker, not waiting for a human
    not_escalated = (409, "not_escalated", "this job is claimed, not waiting for a human", None)
    _refusals(
        api,
        waiting,
        "assign",
        [
            ("missing", [], BODY),  # the body before the lookup
            ("no-uuid", {"assignee": 7}, NOT_FOUND),
            ("missing", {"assignee": 7}, NOT_FOUND),  # the lookup before the fields
            ("job", {}, ASSIGNEE),
            ("job", {"assignee": None}, ASSIGNEE),
            ("job", {"assignee": 7}, ASSIGNEE),
            ("job", {"assignee": "x" * 201}, ASSIGNEE),
            ("job", {"assignee": "x" * 200}, NOT_ASSIGNABLE),
            ("job", {"assignee": "a\x00"}, NOT_ASSIGNABLE),
        ],
    )
    _refusals(
        api, busy, "assign", [("job", {"assignee": 7}, ASSIGNEE), ("job", {"assignee": "x"}, not_escalated)]
    )
    me = alice.user.get_username()
    taken = _post(api, waiting["id"], "assign", {"assignee": f"  {me} "})
    assert (taken.status_code, taken.json()["assignee"]) == (200, me)
    cleared = _post(api, waiting["id"], "assign", {"assignee": " "})
    assert (cleared.status_code, cleared.json()["assignee"]) == (200, "")
