"""The three layers of tenant scoping: ORM manager, tenant header, Postgres row-level security."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import DatabaseError, connection, transaction

from tenants.models import ApiKey, Membership, Tenant
from tenants.scoping import (
    TenantScopeError,
    dangerously_bypass_tenant_scope,
    tenant_context,
    tenant_scoped_models,
)
from tests.conftest import Person


@pytest.mark.smoke
def test_unscoped_query_is_an_error_not_a_leak(alice: Person) -> None:
    with pytest.raises(TenantScopeError):
        list(ApiKey.objects.all())


@pytest.mark.smoke
def test_manager_returns_only_the_active_tenants_rows(
    tenant_a: Tenant, tenant_b: Tenant, alice: Person, carol: Person
) -> None:
    with tenant_context(tenant_b):
        prefixes = set(ApiKey.objects.values_list("prefix", flat=True))
        assert ApiKey.prefix_of(carol.api_key) in prefixes
        assert ApiKey.prefix_of(alice.api_key) not in prefixes
        assert not ApiKey.objects.filter(tenant=tenant_a).exists()


@pytest.mark.smoke
def test_saving_another_tenants_row_is_refused(tenant_a: Tenant, tenant_b: Tenant, alice: Person) -> None:
    with tenant_context(tenant_a):
        key = ApiKey.objects.get(prefix=ApiKey.prefix_of(alice.api_key))
    with tenant_context(tenant_b), pytest.raises(TenantScopeError):
        key.save()


@pytest.mark.smoke
def test_tenant_header_for_a_foreign_tenant_is_404(tenant_a: Tenant, carol: Person) -> None:
    client = carol.session_client()
    client.credentials(HTTP_X_SAGAPLANE_TENANT=tenant_a.slug)
    response = client.get("/api/v1/tenant")
    assert response.status_code == 404
    assert response.json()["error"] == "tenant_not_found"


def _raw_count(table: str, tenant: Tenant) -> int:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM {table} WHERE tenant_id = %s", [tenant.pk])
        return cursor.fetchone()[0]


@pytest.mark.postgres
def test_raw_sql_as_tenant_b_cannot_read_tenant_a(tenant_a: Tenant, tenant_b: Tenant, alice: Person) -> None:
    with dangerously_bypass_tenant_scope():
        assert _raw_count(ApiKey._meta.db_table, tenant_a) >= 1
    for model in tenant_scoped_models():
        with tenant_context(tenant_b):
            assert _raw_count(model._meta.db_table, tenant_a) == 0, model._meta.db_table
    with tenant_context(tenant_a):
        assert _raw_count(Membership._meta.db_table, tenant_a) >= 1


@pytest.mark.postgres
def test_raw_sql_with_no_tenant_sees_nothing(alice: Person, tenant_a: Tenant) -> None:
    assert _raw_count(ApiKey._meta.db_table, tenant_a) == 0


def _insert_membership(tenant: Tenant, user: Any) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {Membership._meta.db_table} (tenant_id, user_id, role, created_at) "
            "VALUES (%s, %s, 'owner', now())",
            [tenant.pk, user.pk],
        )


def _is_member(tenant: Tenant, user: Any) -> bool:
    with tenant_context(tenant):
        return Membership.objects.filter(user=user).exists()


@pytest.mark.postgres
def test_raw_insert_into_another_tenant_is_refused(tenant_a: Tenant, tenant_b: Tenant, carol: Person) -> None:
    """Carol (of bravo) makes herself an owner of acme in raw SQL. Nothing but RLS stands in the
    way: the row violates no constraint, and raw SQL skips the ORM's checks."""
    assert not _is_member(tenant_a, carol.user)
    with tenant_context(tenant_b), pytest.raises(DatabaseError) as refused, transaction.atomic():
        _insert_membership(tenant_a, carol.user)
    cause = refused.value.__cause__
    assert getattr(cause, "sqlstate", None) == "42501", refused.value  # insufficient_privilege
    assert "row-level security" in str(refused.value)
    assert not _is_member(tenant_a, carol.user)

    # The control: the very same statement succeeds once the table's policy is off, so it was
    # RLS that refused it above. DDL is transactional in Postgres: the savepoint undoes it all.
    table = connection.ops.quote_name(Membership._meta.db_table)
    with tenant_context(tenant_b), pytest.raises(_RolledBack), transaction.atomic():
        with connection.cursor() as cursor:
            # Django's foreign keys are deferred; ALTER TABLE refuses while their checks are pending.
            cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
            cursor.execute(f"ALTER TABLE {table} DISABLE ROW LEVEL SECURITY")
        _insert_membership(tenant_a, carol.user)
        assert _is_member(tenant_a, carol.user)
        raise _RolledBack
    assert not _is_member(tenant_a, carol.user)
    with connection.cursor() as cursor:
        cursor.execute("SELECT relrowsecurity FROM pg_class WHERE relname = %s", [Membership._meta.db_table])
        assert cursor.fetchone() == (True,)


class _RolledBack(Exception):
    """Raised to leave an atomic block through its rollback."""


@pytest.mark.postgres
def test_app_role_is_bound_by_rls(db: None) -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT rolsuper, rolbypassrls FROM pg_roles WHERE rolname = current_user")
        is_superuser, bypasses_rls = cursor.fetchone()
        assert not is_superuser, "the application role must not be a superuser (superusers ignore RLS)"
        assert not bypasses_rls
        for model in tenant_scoped_models():
            cursor.execute(
                "SELECT relrowsecurity, relforcerowsecurity, pg_get_userbyid(relowner) = current_user "
                "FROM pg_class WHERE relname = %s",
                [model._meta.db_table],
            )
            enabled, forced, owned = cursor.fetchone()
            assert enabled, f"{model._meta.db_table} has no row-level security"
            assert forced or not owned, f"{model._meta.db_table} is owned by the app role and not FORCEd"
