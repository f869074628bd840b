"""Record headers are append-only in the database: UPDATE and DELETE are refused by a trigger."""

from __future__ import annotations

import pytest
from django.db import DatabaseError, connection, transaction

from audit import services
from audit.models import Record
from core.scoping import tenant_context
from tenants.actors import named_actor
from tenants.models import Tenant
from tests.support.chains import chain, saga_records
from tests.support.scoping import in_tenant

pytestmark = [pytest.mark.postgres]


@pytest.fixture
def held(tenant_a: Tenant) -> Record:
    in_tenant(services.ingest, tenant_a, "ao", chain(saga_records()), actor=named_actor("test"))
    with tenant_context(tenant_a):
        return Record.objects.get(stream__stream_id="ao", position=2)


def test_orm_update_is_refused(tenant_a: Tenant, held: Record) -> None:
    with tenant_context(tenant_a):
        with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
            Record.objects.filter(pk=held.pk).update(event="EDITED")
        assert Record.objects.get(pk=held.pk).event == held.event


def test_raw_delete_is_refused(tenant_a: Tenant, held: Record) -> None:
    with tenant_context(tenant_a):
        refused = pytest.raises(DatabaseError, match="append-only")
        with refused, transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("DELETE FROM audit_record WHERE id = %s", [held.pk])
        assert Record.objects.filter(pk=held.pk).exists()


def test_raw_update_of_the_hash_is_refused(tenant_a: Tenant, held: Record) -> None:
    with tenant_context(tenant_a):
        refused = pytest.raises(DatabaseError, match="append-only")
        with refused, transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("UPDATE audit_record SET h = %s WHERE id = %s", ["0" * 64, held.pk])
        assert Record.objects.get(pk=held.pk).h == held.h
