"""One effective status: the API's `status` filter, the saga list page's filter, the Fleet chart's
sagas (`started_sagas_active_since`) and `Saga.effective_status` agree on every saga, including
both ways of being orphaned (a running saga whose lease lapsed, and a saga whose projection stores
`orphaned`)."""

from __future__ import annotations

import re
import time
from datetime import timedelta
from typing import Any

from django.test import Client
from django.utils import timezone
from sagaplane.chain import GENESIS, stamp

from audit import services as audit_services
from core.scoping import tenant_context
from sagas import selectors
from sagas.models import Saga, SagaStatus
from tenants.actors import named_actor
from tests.support.factories import Person
from tests.support.scoping import in_tenant


def _chain(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    head = GENESIS
    for seq, record in enumerate(records, start=1):
        record["seq"] = seq
        head = stamp(record, head)
    return records


def _ship(person: Person) -> None:
    now = time.time()
    hour_ago = now - 3600
    records = [
        # Leased for five minutes, just now: running.
        {"ts": now, "event": "SAGA_START", "saga_id": "fresh", "lease_ttl": 300},
        # Leased for a minute, an hour ago, never renewed: its lease lapsed, it is orphaned.
        {"ts": hour_ago, "event": "SAGA_START", "saga_id": "lapsed", "lease_ttl": 60},
        # Running by its records; its projection row is set to orphaned below.
        {"ts": now, "event": "SAGA_START", "saga_id": "stored-orphan", "lease_ttl": 300},
        {"ts": now, "event": "SAGA_START", "saga_id": "done", "lease_ttl": 300},
        {"ts": now, "event": "SAGA_COMPLETE", "saga_id": "done"},
    ]
    in_tenant(
        audit_services.ingest, person.tenant, "agent-status", _chain(records), actor=named_actor("test")
    )
    with tenant_context(person.tenant):
        Saga.objects.filter(saga_id="stored-orphan").update(status=SagaStatus.ORPHANED)


def _from_api(person: Person, status: str) -> set[str]:
    response = person.key_client().get("/api/v1/sagas", {"status": status})
    assert response.status_code == 200, response.content
    return {saga["saga_id"] for saga in response.json()["results"]}


def _from_page(person: Person, status: str) -> set[str]:
    client = Client()
    client.force_login(person.user)
    response = client.get("/sagas/", {"status": status})
    assert response.status_code == 200
    return set(re.findall(r'<tr data-saga="([^"]+)"', response.content.decode()))


def _by_model(person: Person, status: str) -> set[str]:
    with tenant_context(person.tenant):
        return {saga.saga_id for saga in Saga.objects.all() if saga.effective_status() == status}


def _charted(person: Person, status: str) -> set[str]:
    now = timezone.now()
    with tenant_context(person.tenant):
        sagas = selectors.started_sagas_active_since(now - timedelta(days=1), 100, now)
    return {saga.saga_id for saga in sagas if saga.status == status}


def test_api_page_and_model_agree_on_every_status(alice: Person) -> None:
    _ship(alice)
    expected = {
        SagaStatus.RUNNING: {"fresh"},
        SagaStatus.ORPHANED: {"lapsed", "stored-orphan"},
        SagaStatus.COMPLETED: {"done"},
        SagaStatus.ROLLED_BACK: set(),
    }
    for status, sagas in expected.items():
        assert _by_model(alice, status) == sagas, status
        assert _from_api(alice, status) == sagas, status
        assert _from_page(alice, status) == sagas, status
        assert _charted(alice, status) == sagas, status


def test_the_api_reports_the_status_it_filters_on(alice: Person) -> None:
    _ship(alice)
    response = alice.key_client().get("/api/v1/sagas", {"status": SagaStatus.ORPHANED})
    shown = {
        saga["saga_id"]: (saga["status"], saga["recorded_status"]) for saga in response.json()["results"]
    }
    assert shown == {
        "lapsed": (SagaStatus.ORPHANED, SagaStatus.RUNNING),
        "stored-orphan": (SagaStatus.ORPHANED, SagaStatus.ORPHANED),
    }
