"""A revocation that commits while a request of the same process is reading the key: the request
read the row before the revocation, and remembered it after `revoke_api_key` forgot the key (at
once and at commit), so the revoked key went on working in the revoking process for the memory's
whole window (DESIGN-NOTES: "a key revoked in one process stops working there at once")."""

from __future__ import annotations

from typing import Any

import pytest

from core.scoping import tenant_context
from tenants import authentication, services
from tenants.actors import named_actor
from tenants.models import ApiKey, Tenant
from tests.support.factories import Person


def test_a_key_revoked_while_a_request_reads_it_is_refused_on_the_next_request(
    alice: Person, tenant_a: Tenant, monkeypatch: pytest.MonkeyPatch
) -> None:
    read = authentication.api_key_and_tenant
    revoked: list[bool] = []

    def read_then_revoke(prefix: str, raw_key: str) -> Any:
        found = read(prefix, raw_key)  # the row as it was: not revoked
        if not revoked:
            with tenant_context(tenant_a):
                key = ApiKey.objects.get(prefix=prefix)
            with tenant_context(tenant_a):
                services.revoke_api_key(key, actor=named_actor("test"))  # commits and forgets, meanwhile
            revoked.append(True)
        return found

    monkeypatch.setattr(authentication, "api_key_and_tenant", read_then_revoke)
    client = alice.key_client()
    # It read the key before the revocation; whether it is answered depends on whether it reads
    # the row again after learning the key's tenant (it does: the tenant is on hold by then).
    assert client.get("/api/v1/tenant").status_code in (200, 401)
    assert revoked
    response = client.get("/api/v1/tenant")
    assert response.status_code == 401 and response.json()["error"] == "revoked_api_key"
