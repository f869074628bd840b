"""The saga timeline as a person reads it (issue 29, item 4), without a browser: the agent's name,
absolute times beside relative ones, each step's duration, the abort's cause and the rollback's
report as sentences, approvals and gate refusals on their steps, a step the gate refused (it has
no projected step) in the step list, a warning before a rollback over an IRREVERSIBLE step, and
the search by saga id, scoped to the tenant."""

from __future__ import annotations

import re
import uuid
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from frontend.saga_story import duration_text
from tests.support.factories import Person
from tests.support.sagadata import Writer, saga_forward, saga_rollback

pytestmark = pytest.mark.django_db


def browser(person: Person) -> Client:
    client = Client()
    client.force_login(person.user)
    return client


def ship(person: Person, stream: str, records: list[dict[str, Any]]) -> None:
    response = person.key_client().post(
        f"/api/v1/streams/{stream}/records", {"records": records}, format="json"
    )
    assert response.status_code == 200, response.content


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0.85, "850 ms"), (3.21, "3.2 s"), (125, "2 min 5 s"), (3780, "1 h 3 min"), (None, ""), (-1, "")],
)
def test_durations_read_as_people_say_them(seconds: float | None, text: str) -> None:
    assert duration_text(seconds) == text


def _refused_saga(writer: Writer) -> tuple[str, list[dict[str, Any]]]:
    """A saga whose second call the gate refused (a kill switch): no step row, one GATE_DENY."""
    saga_id = f"saga-{uuid.uuid4().hex[:12]}"
    records = [
        writer.record("SAGA_START", saga_id=saga_id, name="payout", agent="payments-bot", lease_ttl=300),
        writer.record(
            "GATE_DENY",
            saga_id=saga_id,
            step_id=f"{saga_id}-s1",
            tool="bank.wire",
            semantics="IRREVERSIBLE",
            kwargs={"amount": 100},
            reason="halted",
            answer={"decision": "deny", "reason": "halted"},
        ),
    ]
    return saga_id, records


def test_the_timeline_tells_times_durations_cause_and_report(alice: Person) -> None:
    writer = Writer()
    saga_id, records = saga_forward(writer, name="checkout")
    ship(alice, "agent-story", records + saga_rollback(writer, saga_id))
    body = browser(alice).get(reverse("saga-detail", args=[saga_id])).content.decode()
    assert re.search(r'class="abs-time">\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC<', body)
    assert "(saga aborted)" in body and "SAGA_ABORTED</code>)" not in body
    forward = body[body.index('id="forward-steps"') : body.index('id="compensations"')]
    assert len(re.findall(r'class="step-time"><time datetime="[^"]+">[^<]+ UTC</time> · took', forward)) == 2
    cause = re.search(r'<p id="abort-cause">(.*?)</p>', body, re.S)
    assert (
        cause and "RuntimeError(&#x27;mail server down&#x27;)" in cause.group(1) and "{" not in cause.group(1)
    )
    report = re.search(r'<p id="rollback-report">(.*?)</p>', body, re.S)
    assert report and "Rollback ended clean" in report.group(1)
    assert "2 compensated, 0 failed, 0 orphaned, 0 unresolved" in report.group(1)


def test_a_refused_step_is_in_the_step_list_with_the_agents_name(alice: Person) -> None:
    saga_id, records = _refused_saga(Writer())
    ship(alice, "agent-refused", records)
    body = browser(alice).get(reverse("saga-detail", args=[saga_id])).content.decode()
    assert re.search(r'id="saga-agent"><strong>payments-bot</strong>', body)
    steps = body[body.index('id="forward-steps"') : body.index('id="records-heading"')]
    assert 'data-tool="bank.wire" class="refused-step"' in steps
    assert "Refused by the gate" in steps and "halted" in steps


def _committed(writer: Writer, saga_id: str, n: int, tool: str, semantics: str) -> list[dict[str, Any]]:
    step_id = f"{saga_id}-s{n}"
    common = {"saga_id": saga_id, "step_id": step_id, "tool": tool, "semantics": semantics}
    compensation = (
        {"handler": f"undo.{tool}", "recoverable": True, "kwargs": {}}
        if semantics != "IRREVERSIBLE"
        else None
    )
    return [
        writer.record("STEP_INTENT", **common, kwargs={"n": n}),
        writer.record("STEP_COMMITTED", **common, compensation=compensation),
    ]


def test_rollback_over_an_irreversible_step_warns_first(alice: Person) -> None:
    writer = Writer()
    saga_id = f"saga-{uuid.uuid4().hex[:12]}"
    records = [writer.record("SAGA_START", saga_id=saga_id, name="payout", lease_ttl=1)]
    for n, (tool, semantics) in enumerate(
        [("ledger.reserve", "COMPENSABLE"), ("bank.wire", "IRREVERSIBLE"), ("mail.send", "COMPENSABLE")],
        start=1,
    ):
        records += _committed(writer, saga_id, n, tool, semantics)
    ship(alice, "agent-warn", records)
    from core.scoping import tenant_context
    from sagas.models import Saga

    with tenant_context(alice.tenant):  # the agent is gone: its lease lapsed
        Saga.objects.filter(saga_id=saga_id).update(lease_expires_at="2000-01-01T00:00:00Z")
    body = browser(alice).get(reverse("saga-detail", args=[saga_id])).content.decode()
    assert 'id="rollback-to-1"' in body and 'id="rollback-to-2"' in body
    warning = re.search(r'id="rollback-warning-1">(.*?)</span>', body)
    assert warning and "step 2 (bank.wire) cannot be undone (IRREVERSIBLE)" in warning.group(1)
    assert 'id="rollback-warning-2"' not in body  # after step 2, nothing irreversible is met
    confirm = re.search(r'data-confirm-warning="([^"]*)"(?:(?!</form>).)*id="rollback-to-1"', body, re.S)
    assert confirm and "step 2 (bank.wire) cannot be undone" in confirm.group(1)


def test_find_a_saga_by_id_in_this_tenant_only(alice: Person, carol: Person) -> None:
    writer = Writer()
    saga_id, records = saga_forward(writer)
    ship(alice, "agent-find", records)
    found = browser(alice).get(reverse("saga-find"), {"saga_id": f"  '{saga_id}' "})
    assert found.status_code == 302 and found["Location"] == reverse("saga-detail", args=[saga_id])
    missing = browser(alice).get(reverse("saga-find"), {"saga_id": "saga-nope"}, follow=True)
    assert "No saga with the id “saga-nope”." in missing.content.decode()
    other = browser(carol).get(reverse("saga-find"), {"saga_id": saga_id}, follow=True)
    assert other.redirect_chain[-1][0] == reverse("sagas") and saga_id in other.content.decode()
    assert "No saga with the id" in other.content.decode()
    page = browser(alice).get(reverse("sagas")).content.decode()
    assert 'role="search"' in page and 'action="/sagas/find"' in page
