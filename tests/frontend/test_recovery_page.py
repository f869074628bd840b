"""The Recovery page (the human queue) and "Rollback to here" on a saga's timeline, through the
real views: who sees what, what each decision records, and that refused decisions change nothing."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from core.scoping import tenant_context
from recovery.models import Job, JobState, Run
from tenants.models import Role
from tests.recovery.sagas import crashed, sweep_later
from tests.support.chains import Writer, server_stream
from tests.support.factories import Person, make_person

pytestmark = pytest.mark.django_db


def browser(person: Person) -> Client:
    client = Client()
    client.force_login(person.user)
    return client


@pytest.fixture
def writer(tenant_a: Any) -> Writer:
    return Writer(tenant_a, "agent-a-1")


def test_the_queue_shows_why_and_risk_staff_decide(alice: Person, bob: Person, writer: Writer) -> None:
    tenant = alice.tenant
    crashed(writer, "wire", steps=2, semantics="IRREVERSIBLE", last="STEP_UNKNOWN")
    crashed(writer, "closure", steps=1, handler=None)
    sweep_later(tenant)
    viewer, owner = browser(bob), browser(alice)
    page = viewer.get("/recovery/").content.decode()
    assert "Outcome unknown" in page and "No recoverable compensation" in page
    assert 'data-saga="wire"' in page and 'data-saga="closure"' in page
    assert "Mark resolved" not in page  # a viewer sees the queue, not the decisions
    assert "Mark resolved" in owner.get("/recovery/").content.decode()
    with tenant_context(tenant):
        wire = Job.objects.get(saga_id="wire", state=JobState.ESCALATED)
        closure = Job.objects.get(saga_id="closure")
    assert viewer.post(f"/recovery/jobs/{wire.pk}/resolve", {"note": "x"}).status_code == 403
    # A resolution needs a note; refused, nothing changes.
    owner.post(f"/recovery/jobs/{wire.pk}/resolve", {"note": "  "})
    with tenant_context(tenant):
        assert Job.objects.get(pk=wire.pk).state == JobState.ESCALATED
    response = owner.post(f"/recovery/jobs/{wire.pk}/resolve", {"note": "bank confirms the wire never left"})
    assert response.status_code == 302
    with tenant_context(tenant):
        resolved = Job.objects.get(pk=wire.pk)
        assert (
            resolved.state == JobState.RESOLVED
            and resolved.resolved_by == f"user:{alice.user.get_username()}"
        )
    record = [r for r in server_stream(tenant) if r["event"] == "RECOVERY_RESOLVED"][-1]
    assert record["note"] == "bank confirms the wire never left" and record["old"]["state"] == "escalated"
    # Retry is refused for a step with no handler; quarantine sets the saga aside.
    owner.post(f"/recovery/jobs/{closure.pk}/retry")
    with tenant_context(tenant):
        assert Job.objects.get(pk=closure.pk).state == JobState.ESCALATED
    owner.post("/recovery/sagas/closure/quarantine", {"reason": "fraud review"})
    with tenant_context(tenant):
        assert Job.objects.get(pk=closure.pk).state == JobState.CANCELLED
    assert [r["saga_id"] for r in server_stream(tenant) if r["event"] == "SAGA_QUARANTINED"] == ["closure"]
    assert 'data-saga="closure"' not in owner.get("/recovery/").content.decode()


def test_rollback_to_here_on_the_timeline(alice: Person, writer: Writer) -> None:
    tenant = alice.tenant
    viewer = make_person(tenant, "vic", Role.VIEWER)
    crashed(writer, "done", steps=3, end="SAGA_COMPLETE")
    owner = browser(alice)
    timeline = owner.get("/sagas/done/timeline").content.decode()
    # On each committed step with something after it to undo: steps 1 and 2, not the last.
    assert 'id="rollback-to-1"' in timeline and 'id="rollback-to-2"' in timeline
    assert 'id="rollback-to-3"' not in timeline
    assert "rollback-to-" not in browser(viewer).get("/sagas/done/timeline").content.decode()
    assert browser(viewer).post("/sagas/done/rollback", {"to_step": "1"}).status_code == 403
    response = owner.post("/sagas/done/rollback", {"to_step": "1"})
    assert response.status_code == 302 and response["Location"].endswith("/sagas/done/#recovery")
    with tenant_context(tenant):
        run = Run.objects.get(saga_id="done")
        assert sorted(run.jobs.values_list("ordinal", flat=True)) == [2, 3]
    timeline = owner.get("/sagas/done/timeline").content.decode()
    assert 'id="recovery-jobs"' in timeline and timeline.count('data-recovery-state="pending"') >= 2
    assert "rollback-to-" not in timeline  # one run at a time
    again = owner.post("/sagas/done/rollback", {"to_step": "1"}, follow=True)
    assert "already being rolled back" in again.content.decode()


def test_another_tenant_sees_nothing(alice: Person, carol: Person, writer: Writer) -> None:
    crashed(writer, "acme-only", steps=1, handler=None)
    sweep_later(alice.tenant)
    with tenant_context(alice.tenant):
        job = Job.objects.get()
    outsider = browser(carol)
    assert "acme-only" not in outsider.get("/recovery/").content.decode()
    assert outsider.post(f"/recovery/jobs/{job.pk}/resolve", {"note": "mine now"}).status_code == 404
    assert outsider.post(f"/recovery/jobs/{job.pk}/retry").status_code == 404
    assert outsider.post("/sagas/acme-only/rollback", {"to_step": "0"}).status_code == 404
    assert outsider.post("/recovery/sagas/acme-only/quarantine", {"reason": "x"}).status_code == 404
    with tenant_context(alice.tenant):
        assert Job.objects.get().state == JobState.ESCALATED


def _pager(body: str, label: str) -> dict[str, str]:
    """The links of the pager named `label`: {"First page" | "‹ Previous" | "Next ›": href}."""
    import html
    import re

    nav = re.search(rf'<nav class="pager" aria-label="{label}">(.*?)</nav>', body, re.S)
    if nav is None:
        return {}
    return {
        html.unescape(text): html.unescape(href)
        for href, text in re.findall(r'<a href="([^"]+)"[^>]*>([^<]+)</a>', nav[1])
    }


def test_the_lists_page_by_keyset_each_keeping_the_others_place(
    alice: Person, carol: Person, writer: Writer, monkeypatch: pytest.MonkeyPatch
) -> None:
    import re

    from frontend import recovery_views

    monkeypatch.setattr(recovery_views, "PAGE_SIZE", 2)
    tenant = alice.tenant
    for n in range(6):
        crashed(writer, f"stuck-{n}", steps=1, handler=None)  # no handler: each waits for a human
    sweep_later(tenant)
    with tenant_context(tenant):
        oldest_first = list(
            Job.objects.filter(state=JobState.ESCALATED)
            .order_by("escalated_at", "pk")
            .values_list("saga_id", flat=True)
        )
    assert len(oldest_first) == 6
    owner, seen, url = browser(alice), [], "/recovery/"
    queue = "Pages of the steps waiting for a human"
    while url:
        body = owner.get(url).content.decode()
        rows = re.findall(r'<tr data-job="[^"]+" data-saga="([^"]+)"', body)
        assert 0 < len(rows) <= 2
        seen += rows
        links = _pager(body, queue)
        url = "/recovery/" + links["Next ›"].split("#")[0] if "Next ›" in links else ""
    assert seen == oldest_first  # three pages, the longest waiting first, none twice
    # From the last page, Previous shows the two before it.
    assert set(links) == {"First page", "‹ Previous"}
    back = owner.get("/recovery/" + links["‹ Previous"].split("#")[0]).content.decode()
    assert re.findall(r'<tr data-job="[^"]+" data-saga="([^"]+)"', back) == oldest_first[2:4]
    assert _pager(back, queue)["First page"] == "?#queue"
    # Resolving three makes a second page of finished ones; paging it keeps the queue's place.
    with tenant_context(tenant):
        resolved = list(Job.objects.filter(saga_id__in=oldest_first[:3]))
    for job in resolved:
        owner.post(f"/recovery/jobs/{job.pk}/resolve", {"note": "refunded by hand"})
    body = owner.get("/recovery/").content.decode()
    queue_next = _pager(body, queue)["Next ›"].split("#")[0]
    middle = owner.get("/recovery/" + queue_next).content.decode()
    done_next = _pager(middle, "Pages of finished compensations")["Next ›"]
    assert "queue_before=" in done_next and "done_before=" in done_next and done_next.endswith("#done")
    last = owner.get("/recovery/" + done_next.split("#")[0]).content.decode()
    assert re.findall(r'<tr data-job="[^"]+" data-saga="([^"]+)"', last) == re.findall(
        r'<tr data-job="[^"]+" data-saga="([^"]+)"', middle
    )  # the queue stayed on its page
    finished = re.search(r'<ul id="finished">(.*?)</ul>', last, re.S)
    assert finished and len(re.findall(r"<li>", finished[1])) == 1, finished  # the third one, alone
    # A mangled cursor is the first page; another tenant sees none of it.
    assert (
        'data-saga="stuck-' in owner.get("/recovery/?queue_before=yesterday~1&done_after=-1").content.decode()
    )
    other = (
        browser(carol).get("/recovery/?queue_before=" + queue_next.split("queue_before=")[1]).content.decode()
    )
    assert "stuck-" not in other
