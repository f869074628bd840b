"""The three layers of tenant scoping: ORM manager, tenant header, Postgres row-level security;
and the runtime role's inability to lift the last one (core/rls.py)."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.db import DatabaseError, connection, transaction

from core.scoping import (
    TenantScopeError,
    dangerously_bypass_orm_scope,
    tenant_context,
    tenant_scoped_models,
    tenant_statements,
)
from tenants.actors import named_actor
from tenants.models import ApiKey, Membership, Tenant
from tests.support.factories import Person
from transparency.tasks import seal_pending


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
        cursor.execute(
            f"SELECT count(*) FROM {connection.ops.quote_name(table)} WHERE tenant_id = %s", [tenant.pk]
        )
        return cursor.fetchone()[0]


def _tables() -> list[str]:
    return [model._meta.db_table for model in tenant_scoped_models()]


@pytest.mark.smoke
def test_lifting_the_orm_layer_leaves_rls(
    tenant_a: Tenant, tenant_b: Tenant, alice: Person, carol: Person
) -> None:
    """The ORM bypass lifts the manager's filter and nothing else: on SQLite it sees both
    tenants' keys; on Postgres row-level security still shows none (no tenant is active)."""
    with dangerously_bypass_orm_scope():
        prefixes = set(ApiKey.objects.values_list("prefix", flat=True))
    both = {ApiKey.prefix_of(alice.api_key), ApiKey.prefix_of(carol.api_key)}
    if connection.vendor == "postgresql":
        assert prefixes == set()
    else:
        assert both <= prefixes


@pytest.mark.postgres
def test_raw_sql_as_tenant_b_cannot_read_tenant_a(tenant_a: Tenant, tenant_b: Tenant, alice: Person) -> None:
    with tenant_context(tenant_a):
        assert _raw_count(ApiKey._meta.db_table, tenant_a) >= 1  # the rows are there...
        assert _raw_count(Membership._meta.db_table, tenant_a) >= 1
    for table in _tables():
        with tenant_context(tenant_b):
            assert _raw_count(table, tenant_a) == 0, table  # ...and tenant b sees none of them


@pytest.mark.postgres
def test_raw_sql_with_no_tenant_sees_nothing(alice: Person, tenant_a: Tenant) -> None:
    assert _raw_count(ApiKey._meta.db_table, tenant_a) == 0


# The setting the policy used to accept as a bypass, and others a request might try.
SESSION_SETTINGS = [
    ("sagaplane.bypass_rls", "on"),
    ("sagaplane.bypass_rls", "true"),
    ("sagaplane.rls", "off"),
]


@pytest.mark.postgres
@pytest.mark.parametrize("is_local", [True, False], ids=["set-local", "set-session"])
def test_no_session_setting_lifts_rls(
    tenant_a: Tenant, tenant_b: Tenant, alice: Person, carol: Person, is_local: bool
) -> None:
    with tenant_context(tenant_b), connection.cursor() as cursor:
        for name, value in SESSION_SETTINGS:
            cursor.execute("SELECT set_config(%s, %s, %s)", [name, value, is_local])
        cursor.execute("SELECT set_config('sagaplane.tenant_id', %s, true)", [str(tenant_b.pk)])
        for table in _tables():
            assert _raw_count(table, tenant_a) == 0, table
        assert _raw_count(Membership._meta.db_table, tenant_b) >= 1  # the control: b's own rows
    # (A session-level setting made inside the test's transaction is undone with it.)


@pytest.mark.postgres
def test_turning_row_security_off_refuses_instead_of_showing(tenant_a: Tenant, alice: Person) -> None:
    """`SET row_security = off` does not lift a policy for a role bound by it: the query fails."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL row_security = off")
        with pytest.raises(DatabaseError, match="row-level security"), transaction.atomic():
            _raw_count(ApiKey._meta.db_table, tenant_a)


def _refused(sql: str) -> str:
    """Run `sql` as the runtime role in a savepoint; the SQLSTATE it was refused with."""
    with pytest.raises(DatabaseError) as refused, transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(sql)
    return getattr(refused.value.__cause__, "sqlstate", "")


@pytest.mark.postgres
def test_runtime_role_cannot_change_rls_or_the_functions(db: None) -> None:
    from core.rls import cross_tenant_functions

    with connection.cursor() as cursor:
        # Django's foreign keys are deferred; ALTER TABLE refuses while their checks are pending.
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
    for name in _tables():
        table = connection.ops.quote_name(name)
        for statement in (
            f"ALTER TABLE {table} DISABLE ROW LEVEL SECURITY",
            f"ALTER TABLE {table} NO FORCE ROW LEVEL SECURITY",
            f"DROP POLICY tenant_isolation ON {table}",
            f"ALTER POLICY tenant_isolation ON {table} USING (true)",
            f"CREATE POLICY open_door ON {table} USING (true)",
            f"ALTER TABLE {table} OWNER TO CURRENT_USER",
            f"DROP TABLE {table}",
        ):
            assert _refused(statement) == "42501", statement  # insufficient_privilege
    for function in cross_tenant_functions():
        assert _refused(f"DROP FUNCTION {function.signature}") == "42501"
        assert _refused(function.create_statement("public")) == "42501"
    assert _refused("CREATE FUNCTION sagaplane_leak() RETURNS int LANGUAGE sql AS 'SELECT 1'") == "42501"
    assert settings.DATABASE_OWNER is not None
    for role in (settings.DATABASE_OWNER["USER"], "postgres"):
        assert _refused(f"SET ROLE {role}") == "42501"
        assert _refused(f"SET SESSION AUTHORIZATION {role}") == "42501"


def _setting() -> str | None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('sagaplane.tenant_id', true)")
        return cursor.fetchone()[0]


@pytest.mark.postgres
def test_statement_scoped_block_sees_its_tenant_in_autocommit_and_nothing_after(
    transactional_db: None, tenant_a: Tenant, tenant_b: Tenant, alice: Person, carol: Person
) -> None:
    # No transaction around it: every statement must carry the setting itself.
    assert not connection.in_atomic_block
    with tenant_statements(tenant_b):
        assert _raw_count(ApiKey._meta.db_table, tenant_b) >= 1  # b's own rows (the control)
        for table in _tables():
            assert _raw_count(table, tenant_a) == 0, table
        assert _setting() == str(tenant_b.pk)
        assert ApiKey.objects.count() == _raw_count(ApiKey._meta.db_table, tenant_b)  # the ORM too
    # The setting ended with each statement: after the block, no tenant.
    assert _setting() in ("", None)
    assert _raw_count(ApiKey._meta.db_table, tenant_b) == 0


@pytest.mark.postgres
def test_statement_scoped_block_in_a_transaction_leaves_no_setting_behind(
    tenant_a: Tenant, alice: Person
) -> None:
    assert connection.in_atomic_block  # the test's own transaction
    with tenant_statements(tenant_a):
        assert _raw_count(ApiKey._meta.db_table, tenant_a) >= 1
    assert _setting() in ("", None)
    assert _raw_count(ApiKey._meta.db_table, tenant_a) == 0


@pytest.mark.postgres
def test_a_statement_that_cannot_carry_the_tenant_is_refused_outside_a_transaction(
    transactional_db: None, tenant_a: Tenant, alice: Person
) -> None:
    from core.sql import server_cursor

    with tenant_statements(tenant_a):
        with pytest.raises(TenantScopeError), server_cursor() as cursor:
            cursor.execute(f"SELECT count(*) FROM {ApiKey._meta.db_table}")
        with transaction.atomic(), server_cursor() as cursor:  # in one: the setting goes first
            cursor.execute(f"SELECT count(*) FROM {ApiKey._meta.db_table}")
            assert cursor.fetchone()[0] >= 1
    assert _raw_count(ApiKey._meta.db_table, tenant_a) == 0


def test_a_third_tenant_sees_no_seal_watermark_of_the_first_two(
    tenant_a: Tenant, tenant_b: Tenant, alice: Person, carol: Person
) -> None:
    """The sealer's table (transparency.SealState) is scoped like every tenant table: the ORM
    shows a third tenant none of the first two's rows, and on Postgres raw SQL naming their
    tenant ids finds none either (row-level security), while each sees its own."""
    from tenants import founding
    from transparency.models import SealState

    tenant_c = founding.create_tenant(
        "charlie", "Charlie Freight", "founder@charlie.example", "x" * 12, actor=named_actor("test")
    )
    for tenant in (tenant_a, tenant_b, tenant_c):
        seal_pending(tenant)  # each has a watermark row (its creation records)
        with tenant_context(tenant):
            assert list(SealState.objects.values_list("tenant_id", flat=True)) == [tenant.pk]
    table = SealState._meta.db_table
    with tenant_context(tenant_c):
        assert not SealState.objects.filter(tenant__in=[tenant_a, tenant_b]).exists()
        if connection.vendor == "postgresql":
            assert _raw_count(table, tenant_a) == _raw_count(table, tenant_b) == 0
            assert _raw_count(table, tenant_c) == 1
