"""Each tenant-scoping layer, proven on its own with the route-walking isolation test.

- The ORM layer alone (no row-level security: SQLite, or Postgres connected as the owner role,
  which its tables' policies do not bind): the walk passes, and a leak injected into one view (the
  saga list's queryset built with the ORM filter lifted, as a forgotten scope would) fails it.
- Row-level security alone (Postgres, the runtime role, with the tenant manager's filter removed
  from every query): the walk still passes, and so does it with the same injected leak.

A third tenant is checked against the first two in each. The walk itself (both layers on) is
tests/tenants/test_isolation.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.db import connection, models

from audit.models import Record
from core import rls
from core.scoping import TenantManager, dangerously_bypass_orm_scope, tenant_context
from sagas.api import SagaListView
from sagas.models import Saga
from tenants import founding
from tenants.actors import named_actor
from tenants.models import Tenant
from tests.support.chains import ensure_sample
from tests.support.factories import Person, make_person
from tests.support.isolation import assert_sees_nothing_of


@pytest.fixture
def tenant_c(db: None) -> Tenant:
    return founding.create_tenant(
        "charlie", "Charlie Freight", "founder@charlie.example", "x" * 12, actor=named_actor("test")
    )


@pytest.fixture
def dave(tenant_c: Tenant) -> Person:
    return make_person(tenant_c, "dave", "owner")


def _inject_a_leak_into_the_saga_list(monkeypatch: pytest.MonkeyPatch) -> None:
    """The saga list's queryset built with the ORM filter lifted: every tenant's sagas, as far as
    the ORM is concerned."""
    scoped = SagaListView.get_queryset

    def leaky(self: SagaListView) -> Any:
        with dangerously_bypass_orm_scope():
            return scoped(self)

    monkeypatch.setattr(SagaListView, "get_queryset", leaky)


@contextmanager
def _without_rls(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No row-level security: SQLite has none; on Postgres, connect as the owner role (the table
    owner, whom the policies do not bind). Needs a test without an enclosing transaction."""
    if connection.vendor != "postgresql":
        yield
        return
    # The guard middleware would refuse to serve as the owner, rightly; this test wants it to.
    monkeypatch.setattr(rls.RuntimeRoleGuardMiddleware, "verified", True)
    with rls.database_owner():
        yield


def _other_tenants_records_visible_without_a_tenant() -> int:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM {connection.ops.quote_name(Record._meta.db_table)}")
        return cursor.fetchone()[0]


def test_the_orm_layer_alone_keeps_tenants_apart_and_catches_an_injected_leak(
    transactional_db: None,
    monkeypatch: pytest.MonkeyPatch,
    tenant_a: Tenant,
    alice: Person,
    carol: Person,
    dave: Person,
) -> None:
    with _without_rls(monkeypatch):
        # The premise: nothing below the ORM hides rows (raw SQL with no tenant sees them all).
        assert _other_tenants_records_visible_without_a_tenant() > 0

        # (An outsider must hold no evidence of its own: its listings are then empty. Carol's
        # tenant gets a saga once it is walked as the other party, so she goes first.)
        assert assert_sees_nothing_of(carol, tenant_a, alice) > 0
        assert assert_sees_nothing_of(dave, tenant_a, alice) > 0
        assert assert_sees_nothing_of(dave, carol.tenant, carol) > 0

        _inject_a_leak_into_the_saga_list(monkeypatch)
        for outsider, tenant, member in ((dave, tenant_a, alice), (dave, carol.tenant, carol)):
            with pytest.raises(AssertionError, match="api/v1/sagas") as caught:
                assert_sees_nothing_of(outsider, tenant, member)
            # The leak names the other tenant's sagas (pytest shortens a long list: any of them).
            ensure_sample(tenant)
            with tenant_context(tenant):
                theirs = list(Saga.objects.values_list("saga_id", flat=True))
            assert any(saga_id in str(caught.value) for saga_id in theirs)


def _unfiltered(self: TenantManager) -> models.QuerySet:
    return models.QuerySet(self.model, using=self._db)


@pytest.mark.postgres
def test_rls_alone_keeps_tenants_apart_when_the_orm_layer_is_bypassed(
    monkeypatch: pytest.MonkeyPatch, tenant_a: Tenant, alice: Person, carol: Person, dave: Person
) -> None:
    ensure_sample(carol.tenant)
    monkeypatch.setattr(TenantManager, "get_queryset", _unfiltered)
    # The premise: the manager no longer filters (its SQL has no WHERE), yet RLS shows only the
    # active tenant's rows.
    with tenant_context(carol.tenant):
        assert "WHERE" not in str(Saga.objects.all().query)
        assert set(Saga.objects.values_list("tenant_id", flat=True)) == {carol.tenant.pk}
    assert Saga.objects.count() == 0  # no tenant active, and no error from the ORM either

    assert assert_sees_nothing_of(dave, tenant_a, alice) > 0
    assert assert_sees_nothing_of(dave, carol.tenant, carol) > 0

    # The leak the ORM layer alone catches above is hidden here by RLS alone.
    _inject_a_leak_into_the_saga_list(monkeypatch)
    assert assert_sees_nothing_of(dave, tenant_a, alice) > 0
    assert assert_sees_nothing_of(dave, carol.tenant, carol) > 0
