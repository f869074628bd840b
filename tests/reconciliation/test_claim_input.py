"""The reconciliation claim as a typed input (reconciliation/inputs.py): the API refuses what it
refused before, in the one error shape naming the same field, in the same order (worker, max,
wait, then the handlers), and claims as before."""

from __future__ import annotations

from typing import Any

import pytest

from core.scoping import tenant_context
from reconciliation import services
from reconciliation.models import ReconciliationCheck
from tenants.models import Tenant
from tests.support.chains import Writer, compensated_saga
from tests.support.factories import Person
from tests.support.scoping import in_tenant

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_delay")]

API = "/api/v1/reconciliation/claim"
WORKER = "worker: a name of at most 200 characters"
MAX = "max: an integer from 1 to 50"
WAIT = "wait: seconds from 0 (at most 25 are waited)"
LIST = "handlers: a non-empty list of handler names"
EACH = "handlers: each a name of 1 to 200 characters"
NUL = "handlers: names without NUL"


def _shape(answer: Any) -> tuple[int, str, str, str]:
    body = answer.json()
    return answer.status_code, body["error"], body["detail"], body["field"]


def test_claim_bodies_are_refused_by_field_in_the_error_shape(alice: Person) -> None:
    client = alice.key_client()
    ok = {"handlers": ["shop.refund"]}
    cases: list[tuple[Any, tuple[int, str, str, str]]] = [
        ([ok], (400, "invalid", "the body must be a JSON object", "body")),
        ({}, (400, "invalid", LIST, "handlers")),
        ({"handlers": None}, (400, "invalid", LIST, "handlers")),
        ({"handlers": []}, (400, "invalid", LIST, "handlers")),
        ({"handlers": "shop.refund"}, (400, "invalid", LIST, "handlers")),
        ({"handlers": ["h"] * 201}, (400, "invalid", "handlers: at most 200 names", "handlers")),
        ({"handlers": ["h"] * 201 + ["a\x00"]}, (400, "invalid", NUL, "handlers")),  # NUL first
        ({"handlers": [""]}, (400, "invalid", EACH, "handlers")),
        ({"handlers": [1]}, (400, "invalid", EACH, "handlers")),
        ({"handlers": ["x" * 201]}, (400, "invalid", EACH, "handlers")),
        ({**ok, "worker": 5}, (400, "invalid", WORKER, "worker")),
        ({**ok, "worker": "w" * 201}, (400, "invalid", WORKER, "worker")),
        ({**ok, "worker": "a\x00"}, (400, "invalid", WORKER, "worker")),
        ({**ok, "max": 0}, (400, "invalid", MAX, "max")),
        ({**ok, "max": 51}, (400, "invalid", MAX, "max")),
        ({**ok, "max": None}, (400, "invalid", MAX, "max")),
        ({**ok, "max": True}, (400, "invalid", MAX, "max")),
        ({**ok, "max": 2.0}, (400, "invalid", MAX, "max")),
        ({**ok, "wait": -1}, (400, "invalid", WAIT, "wait")),
        ({**ok, "wait": True}, (400, "invalid", WAIT, "wait")),
        ({**ok, "wait": "1"}, (400, "invalid", WAIT, "wait")),
        ({**ok, "wait": None}, (400, "invalid", WAIT, "wait")),
        ({"handlers": [], "worker": 5, "max": 0, "wait": -1}, (400, "invalid", WORKER, "worker")),
        ({"handlers": [], "max": 0, "wait": -1}, (400, "invalid", MAX, "max")),
        ({"handlers": [], "wait": -1}, (400, "invalid", WAIT, "wait")),
    ]
    for body, expected in cases:
        assert _shape(client.post(API, body, format="json")) == expected, body
    for body in ({**ok, "worker": None}, {**ok, "worker": ""}, {**ok, "max": 50, "wait": 0.0}):
        assert client.post(API, body, format="json").json() == {"checks": []}, body


def test_a_claim_names_its_worker_or_the_key_and_takes_at_most_max(
    alice: Person, tenant_a: Tenant, agent_a: Writer
) -> None:
    compensated_saga(agent_a, "refund", charges=["ch_1", "ch_2", "ch_3"])
    in_tenant(services.scan, tenant_a)
    client = alice.key_client()
    body = {"handlers": ["shop.refund", "shop.refund"], "max": 2, "worker": "obs"}
    assert len(client.post(API, body, format="json").json()["checks"]) == 2
    assert len(client.post(API, {"handlers": ["shop.refund"]}, format="json").json()["checks"]) == 1
    with tenant_context(tenant_a):
        workers = sorted(ReconciliationCheck.objects.values_list("claimed_by", flat=True))
    assert workers.count("obs") == 2 and [w for w in workers if w != "obs"][0].startswith("api-key:")
