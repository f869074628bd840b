"""A worker's claim (`POST /api/v1/recovery/claim`) and its batched results
(`POST /api/v1/recovery/results`, or `results` riding on a claim) as typed inputs
(recovery/inputs.py): each refusal keeps its status, code, sentence and field, and the same
precedence as when the view and the services checked the bodies by hand: a body that is not a
JSON object first, then handlers, worker, lease_s, max_jobs and results; within results, the list,
then each item in turn (its shape, id, token, then a failure's error, retryable and reason).
A refused request records none of its results and claims nothing. Written against the
hand-parsed code first, and passing there."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from rest_framework.test import APIClient

from core.scoping import tenant_context
from recovery.models import Job, JobState
from tests.recovery.sagas import HANDLER, crashed, sweep_later
from tests.support.chains import Writer
from tests.support.factories import Person

pytestmark = pytest.mark.django_db

CLAIM = "/api/v1/recovery/claim"
RESULTS = "/api/v1/recovery/results"
NOBODY = "00000000-0000-4000-8000-000000000000"

BODY = (400, "invalid", "the body must be a JSON object", "body")
HANDLERS = (400, "invalid", "handlers: a list of 1 to 500 handler names", "handlers")
WORKER = (400, "invalid", "worker: a name of at most 200 characters", "worker")
LEASE = (400, "invalid", "lease_s: seconds from 1 to 300", "lease_s")
MAX_JOBS = (400, "invalid", "max_jobs: an integer from 1 to 100", "max_jobs")
LIST = (400, "invalid", "results: a list of 1 to 500 results", "results")


def _item(i: int, what: str) -> tuple[int, str, str, str]:
    where = f"results[{i}]"
    sentence = {
        "": "an object with id, token and ok",
        ".id": "a job id the claim returned",
        ".token": "the integer the claim returned",
        ".error": "a string of at most 2000 characters",
        ".retryable": "true or false",
        ".reason": "omit it, or 'no_handler'",
    }[what]
    return 400, "invalid", f"{where}{what}: {sentence}", f"{where}{what}"


def _shape(answer: Any) -> tuple[int, str, str, str | None]:
    body = answer.json()
    return answer.status_code, body["error"], body["detail"], body.get("field")


@pytest.fixture
def held(alice: Person) -> tuple[APIClient, dict[str, Any]]:
    """A worker holding the one job of a crashed saga, with a second saga's job still pending."""
    writer = Writer(alice.tenant, "agent-a-1")
    crashed(writer, "s1", steps=1)
    crashed(writer, "s2", steps=1)
    sweep_later(alice.tenant)
    worker = alice.key_client()
    job = worker.post(CLAIM, {"handlers": [HANDLER]}, format="json").json()["job"]
    assert job is not None
    return worker, job


def _states(person: Person) -> list[str]:
    with tenant_context(person.tenant):
        return sorted(Job.objects.values_list("state", flat=True))


def _failure(job: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"id": job["id"], "token": job["token"], "ok": False, **fields}


def _result_cases(job: dict[str, Any]) -> list[tuple[Any, tuple[int, str, str, str | None]]]:
    """Bodies' `results` and the refusal each gets, on either route."""
    good = {"id": job["id"], "token": job["token"], "ok": True}
    return [
        ("x", LIST),
        ([], LIST),
        (None, LIST),
        ({"id": job["id"]}, LIST),
        ([good] * 501, LIST),
        ([[job["id"], 1, True]], _item(0, "")),
        ([{"id": job["id"], "token": 1}], _item(0, "")),
        ([{"id": job["id"], "token": 1, "ok": 1}], _item(0, "")),
        ([{"id": "nope", "token": "x", "ok": True}], _item(0, ".id")),  # the id before the token
        ([{"id": 7, "token": 1, "ok": True}], _item(0, ".id")),
        ([{"token": 1, "ok": True}], _item(0, ".id")),
        ([{"id": "\x00", "token": 1, "ok": True}], _item(0, ".id")),
        ([{"id": job["id"], "token": "1", "ok": False, "error": 5}], _item(0, ".token")),
        ([{"id": job["id"], "token": True, "ok": True}], _item(0, ".token")),
        ([{"id": job["id"], "token": 1.0, "ok": True}], _item(0, ".token")),
        ([{"id": job["id"], "ok": True}], _item(0, ".token")),
        ([_failure(job, error=5, retryable=1, reason="x")], _item(0, ".error")),
        ([_failure(job, error="e" * 2001)], _item(0, ".error")),
        ([_failure(job, error="a\x00b")], _item(0, ".error")),
        ([_failure(job, retryable=None, reason="x")], _item(0, ".retryable")),
        ([_failure(job, retryable="yes")], _item(0, ".retryable")),
        ([_failure(job, reason="")], _item(0, ".reason")),
        ([_failure(job, reason="other")], _item(0, ".reason")),
        ([good, {"id": NOBODY, "token": "1", "ok": True}], _item(1, ".token")),  # the batch, whole
    ]


def test_results_refuse_as_before_and_record_nothing(
    alice: Person, held: tuple[APIClient, dict[str, Any]]
) -> None:
    worker, job = held
    assert _shape(worker.post(RESULTS, [1], format="json")) == BODY
    assert _shape(worker.post(RESULTS, {}, format="json")) == LIST
    for results, expected in _result_cases(job):
        answer = worker.post(RESULTS, {"results": results}, format="json")
        assert _shape(answer) == expected, results
    assert _states(alice) == ["claimed", "pending"]


def test_claims_refuse_as_before_and_record_nothing(
    alice: Person, held: tuple[APIClient, dict[str, Any]]
) -> None:
    worker, job = held
    bad_results = {"results": [{"id": job["id"], "token": "1", "ok": True}]}
    cases: list[tuple[Any, Any]] = [
        ([1], BODY),
        ({}, HANDLERS),
        ({"handlers": None}, HANDLERS),
        ({"handlers": []}, HANDLERS),
        ({"handlers": "x"}, HANDLERS),
        ({"handlers": [""]}, HANDLERS),
        ({"handlers": [5]}, HANDLERS),
        ({"handlers": ["a\x00"]}, HANDLERS),
        ({"handlers": ["h" * 201]}, HANDLERS),
        ({"handlers": ["h"] * 501}, HANDLERS),
        ({"handlers": [], "worker": 5, "lease_s": 0, "max_jobs": 0, **bad_results}, HANDLERS),
        ({"worker": 5, "lease_s": 0, "max_jobs": 0, **bad_results}, WORKER),
        ({"worker": "w" * 201}, WORKER),
        ({"worker": "a\x00"}, WORKER),
        ({"lease_s": 0.5, "max_jobs": 0, **bad_results}, LEASE),
        ({"lease_s": 300.5}, LEASE),
        ({"lease_s": "5"}, LEASE),
        ({"lease_s": True}, LEASE),
        ({"lease_s": 10**400}, LEASE),
        ({"max_jobs": 0, **bad_results}, MAX_JOBS),
        ({"max_jobs": 101}, MAX_JOBS),
        ({"max_jobs": "5"}, MAX_JOBS),
        ({"max_jobs": True}, MAX_JOBS),
        ({"max_jobs": 2.5}, MAX_JOBS),
        ({"max_jobs": 2**70}, MAX_JOBS),
    ]
    cases += [({"results": results}, expected) for results, expected in _result_cases(job)]
    for body, expected in cases:
        if isinstance(body, dict) and expected not in (HANDLERS,) and "handlers" not in body:
            body = {"handlers": [HANDLER], **body}
        answer = worker.post(CLAIM, body, format="json")
        assert _shape(answer) == expected, body
    assert _states(alice) == ["claimed", "pending"]


def test_what_a_claim_leaves_out_takes_its_default(
    alice: Person, held: tuple[APIClient, dict[str, Any]]
) -> None:
    worker, job = held
    # A wait the long-poll cannot read is no wait; the claim is still served.
    nothing = worker.post(CLAIM, {"handlers": ["tests.none:h"], "wait": "1e400"}, format="json")
    assert (nothing.status_code, nothing.json()) == (200, {"job": None})
    # A null max_jobs is one job, answered as a batch; a null or empty worker is the key's actor;
    # a null lease is the default (30 s).
    body = {"handlers": [HANDLER], "max_jobs": None, "worker": "", "lease_s": None, "worker_id": 5}
    taken = worker.post(CLAIM, body, format="json").json()
    assert set(taken) == {"job", "jobs"} and taken["jobs"] == [taken["job"]]
    with tenant_context(alice.tenant):
        row = Job.objects.get(pk=taken["job"]["id"])
    assert row.claimed_by.startswith("api-key:")
    assert row.lease_expires_at is not None and row.first_claimed_at is not None
    assert row.lease_expires_at - row.first_claimed_at == timedelta(seconds=30)


def test_results_ride_on_a_claim_and_failures_take_their_defaults(
    alice: Person, held: tuple[APIClient, dict[str, Any]]
) -> None:
    worker, job = held
    # A completion's other fields are not judged; a failure's null error is none, and it retries.
    extra = {"error": 5, "retryable": "x", "reason": "x"}
    done = worker.post(
        CLAIM,
        {"handlers": [HANDLER], "results": [{"id": job["id"], "token": job["token"], "ok": True, **extra}]},
        format="json",
    ).json()
    assert done["results"] == [{"id": job["id"], "state": JobState.COMPENSATED}]
    other = done["job"]
    assert other is not None and other["id"] != job["id"]
    failed = worker.post(RESULTS, {"results": [_failure(other, error=None, reason=None)]}, format="json")
    assert failed.json() == {"results": [{"id": other["id"], "state": JobState.PENDING}]}
    with tenant_context(alice.tenant):
        assert Job.objects.get(pk=other["id"]).last_error == ""
    stale = worker.post(RESULTS, {"results": [_failure(other, error="late")]}, format="json").json()
    (answer,) = stale["results"]
    assert (answer["id"], answer["error"]) == (other["id"], "stale_token")
