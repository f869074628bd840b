"""The management commands of ARCHITECTURE.md §8, as an operator runs them."""

from __future__ import annotations

from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from rest_framework.test import APIClient

from core.scoping import tenant_context
from sagas.models import Saga
from tenants.models import Membership, Tenant

pytestmark = pytest.mark.smoke


def _run(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_create_tenant_and_a_key_printed_alone_on_the_last_line(db: None) -> None:
    _run("create_tenant", "zeta", "--name", "Zeta Corp", "--owner-email", "boss@zeta.example")
    tenant = Tenant.objects.get(slug="zeta")
    with tenant_context(tenant):
        assert Membership.objects.get().role == "owner"
    output = _run("create_api_key", "--tenant", "zeta", "--name", "bot", "--scopes", "ingest,read")
    key = output.strip().splitlines()[-1]
    assert key.startswith("sp_") and " " not in key
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    body = client.get("/api/v1/tenant").json()
    assert body["tenant"]["slug"] == "zeta" and body["scopes"] == ["ingest", "read"]


def test_an_audit_key_from_the_command_reaches_exports_and_nothing_else(db: None) -> None:
    _run("create_tenant", "zeta", "--name", "Zeta Corp", "--owner-email", "boss@zeta.example")
    key = _run("create_api_key", "--tenant", "zeta", "--name", "auditor", "--scopes", "audit,control")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key.strip().splitlines()[-1]}")
    assert client.get("/api/v1/audit/exports").status_code == 200
    refused = client.get("/api/v1/sagas")
    assert refused.status_code == 403 and refused.json()["error"] == "missing_scope"


def test_bad_arguments_are_refused_with_the_field(db: None) -> None:
    _run("create_tenant", "zeta", "--name", "Zeta", "--owner-email", "boss@zeta.example")
    with pytest.raises(CommandError, match="slug"):
        _run("create_tenant", "zeta", "--name", "Again", "--owner-email", "x@zeta.example")
    with pytest.raises(CommandError, match="scopes"):
        _run("create_api_key", "--tenant", "zeta", "--name", "bot", "--scopes", "root")
    with pytest.raises(CommandError, match="tenant"):
        _run("create_api_key", "--tenant", "nope", "--name", "bot")


def test_seed_demo_is_people_a_key_and_a_history_idempotently(db: None, settings, tmp_path: Path) -> None:
    settings.DATA_DIR = tmp_path
    _run("seed_demo", "--sagas", "6")
    tenant = Tenant.objects.get(slug="demo")
    with tenant_context(tenant):
        roles = set(Membership.objects.values_list("role", flat=True))
        statuses = list(Saga.objects.values_list("status", flat=True))
    assert roles == {"owner", "approver", "auditor", "viewer"}
    assert len(statuses) == 6
    key = (tmp_path / "demo_api_key").read_text()
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    listed = client.get("/api/v1/sagas").json()
    assert len(listed["results"]) == 6
    _run("seed_demo", "--sagas", "6")
    with tenant_context(tenant):
        assert Saga.objects.count() == 6
    assert (tmp_path / "demo_api_key").read_text() == key
