"""The SECURITY DEFINER functions, from the runtime role's side: none exists but the declared
cross-tenant questions (a definer created any other way would escape test_rls' checks), and the
key-authentication function answers only the holder of a key's secret (prefix AND hash), never a
row for a prefix alone, another key's hash, or a hash under another prefix."""

from __future__ import annotations

import pytest
from django.db import connection

from core import rls
from tenants.models import ApiKey, Tenant, hash_api_key
from tests.support.factories import Person

pytestmark = pytest.mark.postgres


def _definers_in_schema() -> set[str]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
            "WHERE p.prosecdef AND n.nspname = current_schema()"
        )
        return {name for (name,) in cursor.fetchall()}


def test_every_definer_in_the_schema_is_a_declared_cross_tenant_question(db: None) -> None:
    declared = {function.name for function in rls.cross_tenant_functions()}
    assert "sagaplane_api_key_auth" in declared
    assert _definers_in_schema() == declared  # equal: the query sees them all, and nothing else


def _auth_rows(prefix: str, presented_hash: str) -> list[tuple[object, ...]]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT * FROM sagaplane_api_key_auth(%s, %s)", [prefix, presented_hash])
        return cursor.fetchall()


def test_the_key_authentication_function_answers_only_the_secrets_holder(
    tenant_a: Tenant, tenant_b: Tenant, alice: Person, carol: Person
) -> None:
    a_prefix, c_prefix = ApiKey.prefix_of(alice.api_key), ApiKey.prefix_of(carol.api_key)
    assert a_prefix and c_prefix
    a_hash, c_hash = hash_api_key(alice.api_key), hash_api_key(carol.api_key)
    (row,) = _auth_rows(a_prefix, a_hash)  # the holder: one row, its own tenant
    assert row[1] == tenant_a.pk and a_hash in row
    assert _auth_rows(c_prefix, c_hash)[0][1] == tenant_b.pk
    for prefix, presented in [
        (a_prefix, c_hash),  # another key's hash under this prefix
        (c_prefix, a_hash),  # this key's hash under another tenant's prefix
        (a_prefix, ""),
        (a_prefix, "%"),
        (a_prefix, "' OR '1'='1"),
        ("%", a_hash),
        ("", ""),
    ]:
        assert _auth_rows(prefix, presented) == [], (prefix, presented)
