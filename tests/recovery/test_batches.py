"""Batches: a claim may take several jobs (`max_jobs`), one request may carry several results
(`POST /api/v1/recovery/results`), and `sagaplane worker --concurrency N` runs several handlers at
once over both. Each guarantee of the one-job path still holds: one job per saga at a time,
newest first; a stale token records nothing; a job none of the workers serves escalates as
"no handler". Both databases."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest
import sagaplane as sp
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from core.scoping import tenant_context
from recovery.models import Job, JobState, Run, RunState
from recovery.tasks import sweep_tenant
from tenants.models import Tenant
from tests.recovery.sagas import HANDLER, crashed, sweep_later
from tests.support.chains import Writer, server_stream
from tests.support.factories import Person

CLAIM = "/api/v1/recovery/claim"
NOBODY = "00000000-0000-0000-0000-000000000000"
RESULTS = "/api/v1/recovery/results"


def claim_many(client: APIClient, max_jobs: int, **extra: Any) -> list[dict[str, Any]]:
    response = client.post(CLAIM, {"handlers": [HANDLER], "max_jobs": max_jobs, **extra}, format="json")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["job"] == (body["jobs"][0] if body["jobs"] else None)
    return list(body["jobs"])


def results(client: APIClient, items: list[dict[str, Any]]) -> Any:
    return client.post(RESULTS, {"results": items}, format="json")


def ok(job: dict[str, Any]) -> dict[str, Any]:
    return {"id": job["id"], "token": job["token"], "ok": True}


@pytest.mark.django_db
def test_a_batch_claim_takes_each_sagas_newest_step_and_a_batch_of_results_moves_them_on(
    alice: Person, writer_a: Writer
) -> None:
    tenant = alice.tenant
    for saga in ("b1", "b2", "b3"):
        crashed(writer_a, saga, steps=3)
    assert sweep_later(tenant)["taken_over"] == 3
    worker = alice.key_client()
    for step in (3, 2, 1):
        jobs = claim_many(worker, 10)
        assert sorted(job["saga_id"] for job in jobs) == ["b1", "b2", "b3"]  # one per saga
        assert {job["step"] for job in jobs} == {step}  # newest first
        assert claim_many(worker, 10) == []  # the older steps wait for these
        answer = results(worker, [ok(job) for job in jobs])
        assert answer.status_code == 200, answer.content
        assert [a["state"] for a in answer.json()["results"]] == ["compensated"] * 3
    with tenant_context(tenant):
        assert set(Run.objects.values_list("state", flat=True)) == {RunState.DONE}
    stream = server_stream(tenant)
    compensated = [r["step_id"] for r in stream if r["event"] == "COMPENSATED"]
    assert sorted(compensated) == sorted(f"{s}-s{n}" for s in ("b1", "b2", "b3") for n in (1, 2, 3))
    ends = [r["saga_id"] for r in stream if r["event"] == "ROLLBACK_END"]
    assert sorted(ends) == ["b1", "b2", "b3"]
    # Each saga's ROLLBACK_END comes after its last COMPENSATED.
    for saga in ("b1", "b2", "b3"):
        positions = [i for i, r in enumerate(stream) if r.get("saga_id") == saga]
        assert stream[positions[-1]]["event"] == "ROLLBACK_END"


@pytest.mark.django_db
def test_a_stale_token_in_a_batch_records_nothing_and_the_others_are_recorded(
    alice: Person, writer_a: Writer
) -> None:
    tenant = alice.tenant
    for saga in ("c1", "c2", "c3"):
        crashed(writer_a, saga, steps=1)
    sweep_later(tenant)
    worker = alice.key_client()
    jobs = {job["saga_id"]: job for job in claim_many(worker, 3)}
    assert set(jobs) == {"c1", "c2", "c3"}
    answer = results(
        worker,
        [
            ok(jobs["c1"]),
            {"id": jobs["c2"]["id"], "token": jobs["c2"]["token"] + 1, "ok": True},  # not its token
            {"id": jobs["c3"]["id"], "token": jobs["c3"]["token"], "ok": False, "error": "card API down"},
            ok(jobs["c1"]),  # the same result twice: the second is stale
        ],
    )
    assert answer.status_code == 200, answer.content
    out = answer.json()["results"]
    assert out[0] == {"id": jobs["c1"]["id"], "state": "compensated"}
    assert out[1]["error"] == "stale_token" and out[3]["error"] == "stale_token"
    assert out[2] == {"id": jobs["c3"]["id"], "state": "pending"}  # retried after a backoff
    with tenant_context(tenant):
        states = dict(Job.objects.values_list("saga_id", "state"))
    assert states == {"c1": "compensated", "c2": "claimed", "c3": "pending"}
    stream = server_stream(tenant)
    assert [r["saga_id"] for r in stream if r["event"] == "COMPENSATED"] == ["c1"]
    assert [r["saga_id"] for r in stream if r["event"] == "COMPENSATION_FAILED"] == ["c3"]
    # The holder of c2's real token still can record it.
    assert results(worker, [ok(jobs["c2"])]).json()["results"][0]["state"] == "compensated"


@pytest.mark.django_db
def test_a_claim_without_max_jobs_answers_as_before(alice: Person, writer_a: Writer) -> None:
    for saga in ("d1", "d2"):
        crashed(writer_a, saga, steps=1)
    sweep_later(alice.tenant)
    body = alice.key_client().post(CLAIM, {"handlers": [HANDLER]}, format="json").json()
    assert set(body) == {"job"} and body["job"]["saga_id"] in {"d1", "d2"}


@pytest.mark.django_db
@pytest.mark.parametrize("max_jobs", [0, 101, "5", True, 2.5, [3]])
def test_hostile_max_jobs_is_refused(alice: Person, max_jobs: Any) -> None:
    response = alice.key_client().post(CLAIM, {"handlers": [HANDLER], "max_jobs": max_jobs}, format="json")
    assert response.status_code == 400
    assert response.json()["field"] == "max_jobs"


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"results": "x"}, "results"),
        ({"results": []}, "results"),
        ({"results": [{"id": NOBODY, "token": 1}] * 501}, "results"),
        ({"results": [{"id": NOBODY, "token": 1}]}, "results[0]"),
        ({"results": [{"id": "nope", "token": 1, "ok": True}]}, "results[0].id"),
        ({"results": [{"id": 7, "token": 1, "ok": True}]}, "results[0].id"),
        ({"results": [{"id": NOBODY, "token": "1", "ok": True}]}, "results[0].token"),
        (
            {"results": [{"id": NOBODY, "token": 1, "ok": False, "error": 5}]},
            "results[0].error",
        ),
        (
            {"results": [{"id": NOBODY, "token": 1, "ok": False, "reason": "x"}]},
            "results[0].reason",
        ),
    ],
)
def test_hostile_results_are_refused(alice: Person, body: dict[str, Any], field: str) -> None:
    response = alice.key_client().post(RESULTS, body, format="json")
    assert response.status_code == 400, response.content
    assert response.json()["field"] == field


@pytest.mark.django_db
def test_results_for_unknown_or_foreign_jobs_record_nothing(
    alice: Person, writer_a: Writer, tenant_b: Tenant
) -> None:
    from tenants.models import Role
    from tests.support.factories import make_person

    crashed(writer_a, "e1", steps=1)
    sweep_later(alice.tenant)
    (job,) = claim_many(alice.key_client(), 5)
    outsider = make_person(tenant_b, "mallory", Role.OWNER)
    answer = results(outsider.key_client(), [ok(job)])
    assert answer.status_code == 200
    assert answer.json()["results"][0]["error"] == "not_found"
    with tenant_context(alice.tenant):
        assert Job.objects.get(saga_id="e1").state == JobState.CLAIMED


@pytest.mark.django_db
def test_a_job_no_worker_serves_escalates_as_no_handler(
    alice: Person, writer_a: Writer, settings: Any
) -> None:
    settings.SAGAPLANE_RECOVERY_UNCLAIMED_SECONDS = 60
    tenant = alice.tenant
    crashed(writer_a, "orphan", steps=2, handler="billing.void")  # no worker has this handler
    crashed(writer_a, "served", steps=2)
    sweep_later(tenant)
    worker = alice.key_client()
    (job,) = claim_many(worker, 5)  # the worker serves shop.refund: it is busy on "served"
    assert job["saga_id"] == "served"
    assert sweep_later(tenant, 30)["escalated"] == 0  # not yet: within the bound
    now = timezone.now()
    assert sweep_tenant(tenant, now=now + timedelta(seconds=120))["escalated"] == 1
    with tenant_context(tenant):
        orphan = Job.objects.get(saga_id="orphan", state=JobState.ESCALATED)
        assert orphan.escalation == "no_handler" and orphan.step_id == "orphan-s2"
        assert "billing.void" in orphan.last_error and "no worker claimed it" in orphan.last_error
        assert Run.objects.get(saga_id="orphan").state == RunState.ESCALATED
        # "served" waits behind its worker (a queue, not a missing handler): not escalated
        assert not Job.objects.filter(saga_id="served", state=JobState.ESCALATED).exists()
    escalated = [r for r in server_stream(tenant) if r["event"] == "RECOVERY_ESCALATED"]
    assert [(r["saga_id"], r["reason"], r["old"]) for r in escalated] == [
        ("orphan", "no_handler", {"job": "pending"})
    ]
    page = Client()
    page.force_login(alice.user)
    html = page.get("/recovery/").content.decode()
    assert 'data-saga="orphan"' in html and "no worker claimed it" in html


def test_the_sdk_worker_runs_jobs_concurrently_and_reports_them_in_batches(
    transactional_db: None, live_server: Any, alice: Person, tenant_a: Tenant
) -> None:
    writer = Writer(tenant_a, "agent-a-1")
    sagas = [f"p{i}" for i in range(4)]
    for saga in sagas:
        crashed(writer, saga, steps=3)
    sweep_later(tenant_a)
    calls: list[tuple[str, str]] = []
    lock = threading.Lock()
    together = threading.Barrier(4, timeout=30)  # the four sagas' newest steps run at once

    def refund(charge_id: str, idempotency_key: str | None = None) -> None:
        assert idempotency_key is not None
        if charge_id.endswith("-3"):
            together.wait()
        with lock:
            calls.append((charge_id, idempotency_key))

    worker = sp.Worker(
        sp.Client(live_server.url, alice.api_key),
        handlers={HANDLER: refund},
        name="pool-1",
        wait_s=2,
        concurrency=4,
    )
    assert worker.run(max_jobs=12) == 12
    assert len(worker.outcomes) == 12 and all(o.ok and o.recorded for o in worker.outcomes)
    assert sorted(key for _, key in calls) == sorted(f"idem-{s}-{n}" for s in sagas for n in (1, 2, 3))
    for saga in sagas:  # each saga newest first
        mine = [charge for charge, _ in calls if charge.startswith(f"ch-{saga}-")]
        assert mine == [f"ch-{saga}-3", f"ch-{saga}-2", f"ch-{saga}-1"]
    with tenant_context(tenant_a):
        assert set(Job.objects.values_list("state", flat=True)) == {JobState.COMPENSATED}
        assert set(Job.objects.values_list("claimed_by", flat=True)) == {"pool-1"}


@pytest.mark.django_db
def test_a_claim_carrying_a_result_records_it_and_takes_the_step_it_unlocks(
    alice: Person, writer_a: Writer
) -> None:
    crashed(writer_a, "r1", steps=2)
    sweep_later(alice.tenant)
    worker = alice.key_client()
    (newest,) = claim_many(worker, 1)
    assert newest["step"] == 2
    body = {"handlers": [HANDLER], "results": [ok(newest)], "wait": 2}
    answer = worker.post(CLAIM, body, format="json")
    assert answer.status_code == 200, answer.content
    data = answer.json()
    assert data["results"] == [{"id": newest["id"], "state": "compensated"}]
    assert data["job"]["saga_id"] == "r1" and data["job"]["step"] == 1  # unlocked by the result
    # The last result rides on a claim that finds nothing: recorded once, not once per poll.
    last = worker.post(CLAIM, {**body, "results": [ok(data["job"])], "wait": 0.5}, format="json")
    assert last.status_code == 200
    assert last.json() == {"job": None, "results": [{"id": data["job"]["id"], "state": "compensated"}]}
    stream = server_stream(alice.tenant)
    assert [r["step_id"] for r in stream if r["event"] == "COMPENSATED"] == ["r1-s2", "r1-s1"]
    assert [r["saga_id"] for r in stream if r["event"] == "ROLLBACK_END"] == ["r1"]


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"results": [{"id": NOBODY, "token": "1", "ok": True}]}, "results[0].token"),
        ({"results": []}, "results"),
        ({"max_jobs": 0}, "max_jobs"),
        ({"lease_s": 0.5}, "lease_s"),
        ({"handlers": []}, "handlers"),
    ],
)
def test_a_refused_claim_records_none_of_its_results(
    alice: Person, writer_a: Writer, extra: dict[str, Any], field: str
) -> None:
    crashed(writer_a, "r2", steps=1)
    crashed(writer_a, "r3", steps=1)
    sweep_later(alice.tenant)
    worker = alice.key_client()
    (held,) = claim_many(worker, 1)
    body = {"handlers": [HANDLER], "results": [ok(held)], **extra}
    answer = worker.post(CLAIM, body, format="json")
    assert answer.status_code == 400, answer.content
    assert answer.json()["field"] == field and answer.json()["error"] == "invalid"
    with tenant_context(alice.tenant):
        states = dict(Job.objects.values_list("saga_id", "state"))
    assert sorted(states.values()) == ["claimed", "pending"]  # nothing recorded, nothing claimed
    assert not [r for r in server_stream(alice.tenant) if r["event"] == "COMPENSATED"]


def test_a_one_at_a_time_worker_sends_each_result_with_its_next_claim(
    transactional_db: None, live_server: Any, alice: Person, tenant_a: Tenant
) -> None:
    writer = Writer(tenant_a, "agent-a-1")
    for saga in ("q1", "q2"):
        crashed(writer, saga, steps=3)
    sweep_later(tenant_a)
    calls: list[str] = []
    client = sp.Client(live_server.url, alice.api_key)
    paths: list[tuple[str, bool]] = []
    post = client.post

    def recording_post(path: str, body: Any = None, **kw: Any) -> Any:
        paths.append((path, isinstance(body, dict) and "results" in body))
        return post(path, body, **kw)

    client.post = recording_post  # type: ignore[method-assign]
    worker = sp.Worker(
        client, handlers={HANDLER: lambda charge_id, idempotency_key=None: calls.append(charge_id)}, wait_s=1
    )
    assert worker.run(max_jobs=6) == 6
    assert len(worker.outcomes) == 6 and all(o.ok and o.recorded for o in worker.outcomes)
    for saga in ("q1", "q2"):  # each saga newest first
        assert [c for c in calls if c.startswith(f"ch-{saga}-")] == [f"ch-{saga}-{n}" for n in (3, 2, 1)]
    claims = [carried for path, carried in paths if path == CLAIM]
    singles = [path for path, _ in paths if path.endswith("/complete")]
    assert claims == [False] + [True] * 5  # every result but the last rode on a claim
    assert len(singles) == 1  # the last went on its own route
    with tenant_context(tenant_a):
        assert set(Job.objects.values_list("state", flat=True)) == {JobState.COMPENSATED}
    assert len([r for r in server_stream(tenant_a) if r["event"] == "COMPENSATED"]) == 6


def test_a_worker_facing_a_control_plane_that_ignores_results_reports_them_alone(
    transactional_db: None, live_server: Any, alice: Person, tenant_a: Tenant
) -> None:
    writer = Writer(tenant_a, "agent-a-1")
    crashed(writer, "o1", steps=3)
    sweep_later(tenant_a)
    client = sp.Client(live_server.url, alice.api_key)
    post = client.post

    def older_server(path: str, body: Any = None, **kw: Any) -> Any:
        if path == CLAIM and isinstance(body, dict):
            body = {k: v for k, v in body.items() if k != "results"}  # an older claim route
        return post(path, body, **kw)

    client.post = older_server  # type: ignore[method-assign]
    worker = sp.Worker(client, handlers={HANDLER: lambda charge_id, idempotency_key=None: None}, wait_s=1)
    assert worker.run(max_jobs=3) == 3
    assert all(o.ok and o.recorded for o in worker.outcomes) and len(worker.outcomes) == 3
    with tenant_context(tenant_a):
        assert set(Job.objects.values_list("state", flat=True)) == {JobState.COMPENSATED}
    assert len([r for r in server_stream(tenant_a) if r["event"] == "COMPENSATED"]) == 3


@pytest.mark.parametrize("older_control_plane", [False, True])
def test_a_pool_worker_sends_its_results_on_its_claims(
    transactional_db: None,
    live_server: Any,
    alice: Person,
    tenant_a: Tenant,
    monkeypatch: Any,
    older_control_plane: bool,
) -> None:
    from sagaplane import worker as worker_module

    # The reporter never sends on its own before the pool closes: every result a claim can carry
    # rides on one (or, facing a control plane that ignores them, goes on the results route).
    monkeypatch.setattr(worker_module, "PIGGYBACK_S", 60.0)
    writer = Writer(tenant_a, "agent-a-1")
    for saga in ("w1", "w2"):
        crashed(writer, saga, steps=3)
    sweep_later(tenant_a)
    client = sp.Client(live_server.url, alice.api_key)
    post = client.post
    carried: list[int] = []
    alone: list[int] = []

    def recording_post(path: str, body: Any = None, **kw: Any) -> Any:
        if path == CLAIM and isinstance(body, dict):
            if older_control_plane:
                body = {k: v for k, v in body.items() if k != "results"}
            carried.append(len(body.get("results", [])))
        elif path == RESULTS:
            alone.append(len(body["results"]))
        return post(path, body, **kw)

    client.post = recording_post  # type: ignore[method-assign]
    worker = sp.Worker(
        client,
        handlers={HANDLER: lambda charge_id, idempotency_key=None: None},
        wait_s=1,
        concurrency=2,
    )
    assert worker.run(max_jobs=6) == 6
    assert len(worker.outcomes) == 6 and all(o.ok and o.recorded for o in worker.outcomes)
    if older_control_plane:
        assert sum(carried) == 0 and sum(alone) == 6
    else:
        # Each older step is claimable only once its newer one is recorded: the results that
        # unlocked the second and third steps rode on claims (the last ones go when it closes).
        assert sum(carried) >= 4 and sum(carried) + sum(alone) == 6
    with tenant_context(tenant_a):
        assert set(Job.objects.values_list("state", flat=True)) == {JobState.COMPENSATED}
    assert len([r for r in server_stream(tenant_a) if r["event"] == "COMPENSATED"]) == 6
