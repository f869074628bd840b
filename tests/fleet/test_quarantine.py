"""Quarantine of a saga no record has named (issue 23, item 8): 404 `saga_not_found`, nothing
written, unless the caller asks for it with `preemptive: true`, which the quarantine, its record
and the saga's page then say.

Before: `POST /api/v1/sagas/<unknown id>/quarantine` answered 201 and its record created a phantom
saga in the projection."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.management import CommandError, call_command

from core.scoping import tenant_context
from fleet import services
from fleet.gate import GateRequest
from fleet.models import Quarantine
from fleet.stores import DatabaseStore
from sagas.models import Saga
from tenants.actors import named_actor
from tenants.models import Tenant
from tests.hostile.production import Chain
from tests.support.chains import server_stream
from tests.support.factories import Person
from tests.support.scoping import in_statements


def _quarantine(person: Person, saga_id: str, **body: Any) -> Any:
    return person.key_client().post(
        f"/api/v1/sagas/{saga_id}/quarantine", {"reason": "fraud review", **body}, format="json"
    )


def _rows(tenant: Tenant) -> tuple[list[str], list[str]]:
    with tenant_context(tenant):
        return (
            list(Quarantine.objects.values_list("saga_id", flat=True)),
            list(Saga.objects.values_list("saga_id", flat=True)),
        )


def test_an_unknown_saga_is_404_and_nothing_is_written(alice: Person) -> None:
    before = len(server_stream(alice.tenant))
    refused = _quarantine(alice, "no-such-saga")
    assert refused.status_code == 404, refused.content
    assert (refused.json()["error"], refused.json()["field"]) == ("saga_not_found", "saga_id")
    assert _rows(alice.tenant) == ([], [])  # no quarantine, no phantom saga
    assert len(server_stream(alice.tenant)) == before
    assert alice.key_client().get("/api/v1/sagas/no-such-saga").status_code == 404


def test_preemptive_true_sets_aside_a_saga_before_it_starts_and_says_so(alice: Person) -> None:
    answer = _quarantine(alice, "coming-soon", preemptive=True)
    assert answer.status_code == 201, answer.content
    assert answer.json()["preemptive"] is True
    (record,) = [r for r in server_stream(alice.tenant) if r["event"] == "SAGA_QUARANTINED"]
    assert record["new"] == {"quarantined": True, "reason": "fraud review", "preemptive": True}
    call = GateRequest(saga_id="coming-soon", step_id="1", tool="crm.read", args={})
    refused = in_statements(
        services.evaluate, alice.tenant, call, actor=named_actor("test"), store=DatabaseStore()
    )
    assert refused["decision"] == "deny" and refused["reason"] == "quarantined"
    page = alice.session_client().get("/sagas/coming-soon/")
    assert page.status_code == 200
    assert 'id="quarantine-note" data-preemptive="true"' in page.content.decode()
    assert "preemptively" in page.content.decode()


def test_a_known_saga_is_quarantined_as_before_and_not_called_preemptive(alice: Person) -> None:
    chain = Chain("agent-q")
    shipped = alice.key_client().post(
        f"/api/v1/streams/{chain.stream}/records", {"records": chain.saga()}, format="json"
    )
    assert shipped.status_code == 200, shipped.content
    saga_id = chain.sagas[-1]
    answer = _quarantine(alice, saga_id, preemptive=True)  # asked, but the saga is known: not preemptive
    assert answer.status_code == 201 and answer.json()["preemptive"] is False
    page = alice.session_client().get(f"/sagas/{saga_id}/").content.decode()
    assert 'data-preemptive="false"' in page and "preemptively" not in page


@pytest.mark.parametrize("flag", ["yes", 1, None])
def test_preemptive_must_be_a_boolean(alice: Person, flag: Any) -> None:
    refused = _quarantine(alice, "coming-soon", preemptive=flag)
    assert refused.status_code == 400 and refused.json()["field"] == "preemptive"
    assert _rows(alice.tenant) == ([], [])


def test_the_command_needs_preemptive_for_an_unknown_saga(alice: Person) -> None:
    with pytest.raises(CommandError):
        call_command("quarantine", "later", tenant=alice.tenant.slug, reason="r")
    call_command("quarantine", "later", tenant=alice.tenant.slug, reason="r", preemptive=True)
    assert _rows(alice.tenant)[0] == ["later"]
