"""Statement-scoped RLS (`core.scoping.tenant_statements`) under the ways code can nest and
mix it: every statement runs as the tenant the code believes is active, or as none; never as a
tenant left behind by an enclosing block. Raw SQL is the witness: it has no ORM filter, so only
row-level security stands between it and another tenant's rows."""

from __future__ import annotations

import pytest
from django.db import DatabaseError, DataError, IntegrityError, connection, transaction

from core.scoping import TenantScopeError, current_tenant, tenant_context, tenant_statements
from tenants import founding
from tenants.actors import named_actor
from tenants.models import ApiKey, Role, Tenant
from tests.support.factories import PASSWORD, Person, make_person

pytestmark = pytest.mark.postgres

TABLE = ApiKey._meta.db_table


def _visible() -> set[int]:
    """The tenants whose API keys raw SQL can see right now."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT DISTINCT tenant_id FROM {TABLE}")
        return {row[0] for row in cursor.fetchall()}


def _visible_through_a_named_cursor() -> set[int]:
    """The same through a named server-side cursor (what QuerySet.iterator() uses on Postgres)."""
    with connection.chunked_cursor() as cursor:
        cursor.execute(f"SELECT DISTINCT tenant_id FROM {TABLE}")
        return {row[0] for row in cursor.fetchall()}


@pytest.fixture
def three(transactional_db: None, alice: Person, carol: Person) -> tuple[Tenant, Tenant, Tenant]:
    third = founding.create_tenant("third", "Third", "t@third.example", PASSWORD, actor=named_actor("test"))
    make_person(third, "trent", Role.OWNER)
    return alice.tenant, carol.tenant, third


def test_a_nested_statement_scoped_block_runs_as_its_own_tenant(three: tuple[Tenant, Tenant, Tenant]) -> None:
    a, b, c = three
    assert not connection.in_atomic_block
    with tenant_statements(a):
        assert _visible() == {a.pk}
        with tenant_statements(b):
            assert current_tenant() == b
            assert _visible() == {b.pk}  # was {a}: the outer block's set_config came last
            with tenant_statements(c):
                assert _visible() == {c.pk}
            assert _visible() == {b.pk}
        assert _visible() == {a.pk}
    assert _visible() == set()


def test_a_tenant_context_inside_a_statement_scoped_block_runs_as_its_tenant(
    three: tuple[Tenant, Tenant, Tenant],
) -> None:
    a, b, _ = three
    with tenant_statements(a):
        with tenant_context(b):
            assert _visible() == {b.pk}  # was {a}: every statement was prefixed with a's setting
            assert ApiKey.objects.count() >= 1  # the ORM agrees with RLS again
        assert _visible() == {a.pk}
    assert _visible() == set()


def test_a_named_cursor_in_a_transaction_runs_as_the_block_not_a_stale_setting(
    three: tuple[Tenant, Tenant, Tenant],
) -> None:
    a, b, c = three
    with tenant_context(a):  # the transaction's SET LOCAL says a
        with tenant_statements(b):
            assert _visible_through_a_named_cursor() == {b.pk}  # was {a}: DECLARE never ran set_config
            assert {key.tenant_id for key in ApiKey.objects.iterator(chunk_size=2)} == {b.pk}
            with tenant_context(c):
                assert _visible_through_a_named_cursor() == {c.pk}
        assert _visible() == {a.pk}
    assert _visible() == set()


def test_outside_a_transaction_a_named_cursor_is_refused_not_run_with_no_tenant(
    three: tuple[Tenant, Tenant, Tenant],
) -> None:
    a, _, _ = three
    with tenant_statements(a):
        with pytest.raises(TenantScopeError):
            list(ApiKey.objects.iterator(chunk_size=2))
        with pytest.raises(TenantScopeError), connection.cursor() as cursor:
            cursor.executemany(f"UPDATE {TABLE} SET name = name WHERE id = %s", [[1], [2]])
        assert _visible() == {a.pk}  # the block goes on as before


def test_executemany_in_a_transaction_writes_only_the_blocks_tenant(
    three: tuple[Tenant, Tenant, Tenant],
) -> None:
    a, b, _ = three
    with tenant_context(a):
        a_keys = list(ApiKey.objects.values_list("pk", flat=True))
    with tenant_context(b):
        b_keys = list(ApiKey.objects.values_list("pk", flat=True))
    with transaction.atomic(), tenant_statements(b), connection.cursor() as cursor:
        cursor.executemany(
            f"UPDATE {TABLE} SET name = 'touched' WHERE id = %s", [[pk] for pk in a_keys + b_keys]
        )
    with tenant_context(a):
        assert not ApiKey.objects.filter(name="touched").exists()
    with tenant_context(b):
        assert ApiKey.objects.filter(name="touched").count() == len(b_keys)


def test_a_failed_statement_leaves_the_next_one_scoped_and_nothing_after(
    three: tuple[Tenant, Tenant, Tenant],
) -> None:
    a, _, _ = three
    with tenant_statements(a):
        with pytest.raises(DatabaseError), connection.cursor() as cursor:
            cursor.execute("SELECT 1 / 0")
        assert _visible() == {a.pk}
        with pytest.raises(RuntimeError), tenant_statements(three[1]):  # raised out of a nested block
            assert _visible() == {three[1].pk}
            raise RuntimeError
        assert _visible() == {a.pk}
    assert _visible() == set()
    assert connection.execute_wrappers == []  # nothing of the block is left on the connection


def test_a_database_error_inside_a_nested_tenant_context_reaches_the_caller_as_itself(
    three: tuple[Tenant, Tenant, Tenant],
) -> None:
    """The undo of a nested block's SET LOCAL ran in the failed transaction and replaced the error
    (IntegrityError became TransactionManagementError, DataError became InternalError): a caller
    catching the error it expects got a 500 instead. The savepoint's rollback undoes the setting."""
    a, b, _ = three
    with tenant_context(a):
        taken = ApiKey.objects.values_list("prefix", flat=True).first()
        with pytest.raises(IntegrityError), tenant_context(a):
            ApiKey.objects.create(name="dup", prefix=taken, key_hash="x", scopes=[])
        assert _visible() == {a.pk}
        with pytest.raises(DataError), tenant_context(b), connection.cursor() as cursor:
            cursor.execute("SELECT 1 / 0")
        assert _visible() == {a.pk}
        with (
            pytest.raises(DataError),
            transaction.atomic(),
            tenant_statements(b),
            connection.cursor() as cursor,
        ):
            cursor.execute("SELECT 1 / 0")
        assert _visible() == {a.pk}
    assert _visible() == set()


def test_a_savepoint_rolled_back_after_an_error_leaves_the_transaction_usable(
    three: tuple[Tenant, Tenant, Tenant],
) -> None:
    """The gate's transactional path inside the fast route's statement-scoped block catches an
    IntegrityError (an allow raced by its retry) and reads on: the savepoint's ROLLBACK TO ran
    with the tenant's prefix, which the failed transaction refused, and every later statement
    raised TransactionManagementError instead."""
    a, _, _ = three
    with tenant_context(a):
        taken = ApiKey.objects.values_list("prefix", flat=True).first()
    with tenant_statements(a), transaction.atomic():
        with pytest.raises(IntegrityError), transaction.atomic():
            ApiKey.objects.create(name="dup", prefix=taken, key_hash="x", scopes=[])
        assert _visible() == {a.pk}
    assert _visible() == set()
