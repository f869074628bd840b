"""The commands that parsed their bodies by hand now parse a typed input (`core.inputs`): a new
API key, a quarantine, a recovery job's resolution and "rollback to here". Each hostile body (a
wrong type, a misspelt field, a huge string, a NUL, NaN, not an object) is a 400 in the one error
shape naming the field at fault, and changes nothing: no row, no audit record."""

from __future__ import annotations

import json
from typing import Any

import pytest

from core.scoping import tenant_context
from fleet.models import Quarantine
from recovery.models import Job, JobState, Run
from tenants.models import ApiKey, Tenant
from tests.recovery.sagas import escalated_job
from tests.support.chains import ensure_sample, server_stream
from tests.support.factories import Person

pytestmark = pytest.mark.django_db

HUGE = "x" * 100_000
NOT_AN_OBJECT = ([], ("invalid", "body"))
KEYS: list[tuple[Any, tuple[str, str]]] = [
    ({"name": 5, "scopes": ["read"]}, ("invalid_name", "name")),
    ({"name": "", "scopes": ["read"]}, ("invalid_name", "name")),
    ({"name": HUGE, "scopes": ["read"]}, ("invalid_name", "name")),
    ({"name": "a\x00b", "scopes": ["read"]}, ("invalid_name", "name")),
    ({"name": "k", "scopes": "read"}, ("invalid_scope", "scopes")),
    ({"name": "k", "scopes": []}, ("invalid_scope", "scopes")),
    ({"name": "k", "scopes": ["read", "root"]}, ("invalid_scope", "scopes")),
    ({"name": "k", "scopes": ["read\x00"]}, ("invalid_scope", "scopes")),
    ({"name": "k", "scopes": [1]}, ("invalid_scope", "scopes")),
    ({"name": "k", "scope": ["read"]}, ("invalid", "scopes")),  # a misspelt field is not the field
    ({"name": "k", "scopes": ["read"], "expires_at": 1e20}, ("invalid_expiry", "expires_at")),
    ({"name": "k", "scopes": ["read"], "expires_at": "tomorrow"}, ("invalid_expiry", "expires_at")),
    (
        {"name": "k", "scopes": ["read"], "expires_at": "2999-01-01T00:00:00"},
        ("invalid_expiry", "expires_at"),
    ),
    ({"name": "k", "scopes": ["read"], "expires_at": HUGE}, ("invalid_expiry", "expires_at")),
]
QUARANTINES: list[tuple[Any, tuple[str, str]]] = [
    ({"reason": 5}, ("invalid_reason", "reason")),
    ({"reason": " "}, ("invalid_reason", "reason")),
    ({"reason": HUGE}, ("invalid_reason", "reason")),
    ({"reason": "a\x00b"}, ("invalid_reason", "reason")),
    ({"reasons": "typo"}, ("invalid_reason", "reason")),
    ({"reason": "r", "preemptive": "yes"}, ("invalid_preemptive", "preemptive")),
    ({"reason": "r", "preemptive": 1}, ("invalid_preemptive", "preemptive")),
]
RESOLUTIONS: list[tuple[Any, tuple[str, str]]] = [
    ({"note": 5}, ("invalid", "note")),
    ({"note": "   "}, ("invalid", "note")),
    ({"note": HUGE}, ("invalid", "note")),
    ({"note": "a\x00b"}, ("invalid", "note")),
    ({"notes": "typo"}, ("invalid", "note")),
    ({"note": ["dealt", "with"]}, ("invalid", "note")),
]
ROLLBACKS: list[tuple[Any, tuple[str, str]]] = [
    ({"to_step": "0"}, ("invalid", "to_step")),
    ({"to_step": True}, ("invalid", "to_step")),
    ({"to_step": -1}, ("invalid", "to_step")),
    ({"to_step": 1.5}, ("invalid", "to_step")),
    ({"to_step": 10**30}, ("invalid", "to_step")),  # no bigint holds it: refused, not a 500
    ({"to": 0}, ("invalid", "to_step")),
]


def _state(tenant: Tenant) -> tuple[Any, ...]:
    with tenant_context(tenant):
        return (
            sorted(ApiKey.objects.values_list("prefix", flat=True)),
            list(Quarantine.objects.values_list("saga_id", flat=True)),
            sorted(Job.objects.values_list("state", flat=True)),
            Run.objects.count(),
            len(server_stream(tenant)),
        )


def _refused(person: Person, url: str, body: Any, expected: tuple[str, str]) -> None:
    before = _state(person.tenant)
    answer = person.session_client().post(url, body, format="json")
    assert answer.status_code == 400, (body, answer.content)
    shape = answer.json()
    assert set(shape) == {"error", "detail", "field"}, shape
    assert (shape["error"], shape["field"]) == expected, (body, shape)
    assert "\x00" not in shape["detail"] and len(shape["detail"]) < 200
    assert _state(person.tenant) == before, body


@pytest.mark.parametrize(("body", "expected"), [*KEYS, NOT_AN_OBJECT])
def test_a_hostile_key_body_is_refused_by_field(alice: Person, body: Any, expected: tuple[str, str]) -> None:
    _refused(alice, "/api/v1/keys", body, expected)


@pytest.mark.parametrize(("body", "expected"), [*QUARANTINES, NOT_AN_OBJECT])
def test_a_hostile_quarantine_body_is_refused_by_field(
    alice: Person, body: Any, expected: tuple[str, str]
) -> None:
    saga_id = ensure_sample(alice.tenant).saga_id
    _refused(alice, f"/api/v1/sagas/{saga_id}/quarantine", body, expected)


@pytest.mark.parametrize(("body", "expected"), [*RESOLUTIONS, NOT_AN_OBJECT])
def test_a_hostile_resolution_is_refused_by_field(
    alice: Person, body: Any, expected: tuple[str, str]
) -> None:
    job = escalated_job(alice.tenant)
    _refused(alice, f"/api/v1/recovery/jobs/{job.pk}/resolve", body, expected)
    with tenant_context(alice.tenant):
        assert Job.objects.get(pk=job.pk).state == JobState.ESCALATED


@pytest.mark.parametrize(("body", "expected"), [*ROLLBACKS, NOT_AN_OBJECT])
def test_a_hostile_rollback_is_refused_by_field(alice: Person, body: Any, expected: tuple[str, str]) -> None:
    escalated_job(alice.tenant)
    _refused(alice, "/api/v1/sagas/acme-crashed/rollback", body, expected)


@pytest.mark.parametrize("url", ["/api/v1/keys", "/api/v1/sagas/{}/quarantine", "/api/v1/sagas/{}/rollback"])
def test_nan_is_malformed_json_and_changes_nothing(alice: Person, url: str) -> None:
    url = url.format(ensure_sample(alice.tenant).saga_id)
    before = _state(alice.tenant)
    body = '{"name": NaN, "scopes": ["read"], "reason": NaN, "to_step": NaN}'
    answer = alice.session_client().post(url, body, content_type="application/json")
    assert answer.status_code == 400, answer.content
    assert answer.json()["error"] == "malformed_json"
    assert _state(alice.tenant) == before


def test_the_typed_bodies_still_do_what_they_did(alice: Person) -> None:
    client = alice.session_client()
    made = client.post(
        "/api/v1/keys", {"name": " ci ", "scopes": ["read", "read"], "extra": 1}, format="json"
    )
    assert made.status_code == 201, made.content
    assert (made.json()["name"], made.json()["scopes"]) == (" ci ", ["read"])
    job = escalated_job(alice.tenant)
    resolved = client.post(f"/api/v1/recovery/jobs/{job.pk}/resolve", {"note": "refunded"}, format="json")
    assert (resolved.status_code, resolved.json()["state"]) == (200, "resolved")
    held = client.post("/api/v1/sagas/later/quarantine", {"reason": "r", "preemptive": True}, format="json")
    assert (held.status_code, held.json()["preemptive"]) == (201, True)
    record = server_stream(alice.tenant)[-1]
    assert record["event"] == "SAGA_QUARANTINED" and json.dumps(record["new"])
