"""The gate through Django's view (the fast route hands it a call it has not learned): a pooled
connection's wait running out as the view enters the tenant is the same fail-closed refusal as
anywhere else in the call, 503 control_plane_unavailable with Retry-After, never a 500."""

from __future__ import annotations

from typing import Any

import psycopg_pool
import pytest
from django.db import OperationalError

from tenants import permissions
from tenants.models import Tenant
from tests.support.factories import scoped_key_client

pytestmark = pytest.mark.django_db


class _PoolWaitOver:
    """A scope that cannot be entered: Django's OperationalError from the pool's PoolTimeout."""

    def __init__(self, tenant: Any) -> None:
        self.tenant = tenant

    def __enter__(self) -> None:
        error = OperationalError("couldn't get a connection after 0.50 sec")
        error.__cause__ = psycopg_pool.PoolTimeout("couldn't get a connection after 0.50 sec")
        raise error

    def __exit__(self, *exc: object) -> None:
        return None


def test_a_pool_wait_over_as_the_view_enters_the_tenant_is_a_503_refusal(
    tenant_a: Tenant, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = scoped_key_client(tenant_a, "gate")
    monkeypatch.setattr(permissions, "tenant_context", _PoolWaitOver)
    body = {"saga_id": "s-outage", "step_id": "1", "tool": "pay.card", "args": {"amount": 5}}
    answer = client.post("/api/v1/gate/evaluate", body, format="json")
    assert answer.status_code == 503, answer.content
    assert answer.json()["error"] == "control_plane_unavailable"
    assert answer["Retry-After"] == "1"
