"""The evidence store's vendor SQL (audit/queries.py) answers the same on every database: each test
asserts one answer, and the suite runs it on Postgres and on SQLite."""

from __future__ import annotations

import hashlib
import json

import pytest
from django.utils import timezone

from audit import queries
from audit.models import Record, RecordPayload, Stream, TenantLog
from core.scoping import tenant_context
from tenants.models import Tenant

pytestmark = pytest.mark.django_db


def _rows(tenant: Tenant, stream: Stream, first: int, n: int) -> list[queries.StoredRow]:
    """n records following position `first` - 1 of `stream`; the second has no payload (redacted)."""
    rows = []
    for position in range(first, first + n):
        redacted = "erased" if position == first + 1 else ""
        rows.append(
            queries.StoredRow(
                tenant.pk,
                stream,
                position,
                position * 10,
                1.5 + position,
                repr(1.5 + position),
                "STEP_INTENT",
                f"{position:064x}",
                f"{position - 1:064x}",
                f"{position + 1:064x}",
                "saga-1",
                f"s{position}",
                "shop.charge",
                redacted,
                hashlib.sha256(str(position).encode()).digest(),
                None if redacted else json.dumps({"amount": position, "note": "café ☕"}),
                None if redacted else f"salt-{position}",
                '{"event": "x"}' if position == first else "",
            )
        )
    return rows


def _append(tenant: Tenant, stream: Stream, rows: list[queries.StoredRow]) -> int:
    queries.prepare_records(rows)
    queries.wait_for_log(tenant.pk)
    return queries.append(tenant.pk, stream, timezone.now(), rows)


def _log_size(tenant: Tenant) -> int:
    log = TenantLog.objects.filter(tenant=tenant).first()
    return 0 if log is None else log.size


def test_appended_records_take_the_next_leaf_indices_with_their_payloads(
    tenant_a: Tenant, tenant_b: Tenant
) -> None:
    with tenant_context(tenant_a):
        stream = Stream.objects.create(tenant=tenant_a, stream_id="parity")
        size = _log_size(tenant_a)
        rows = _rows(tenant_a, stream, 1, 3)
        assert _append(tenant_a, stream, rows) == size
        assert [r.leaf_index for r in rows] == [size, size + 1, size + 2]
        assert all(r.pk is not None and r.received_at is not None for r in rows)
        assert _log_size(tenant_a) == size + 3
        stored = Record.objects.filter(stream=stream).order_by("position")
        columns = ("position", "seq", "ts", "ts_json", "event", "cd", "ph", "h", "saga_id", "step_id", "tool")
        columns += ("redacted", "verbatim", "leaf_index")
        assert [tuple(getattr(r, c) for c in columns) for r in stored] == [
            tuple(getattr(r, c) for c in columns) for r in rows
        ]
        assert [bytes(r.leaf_hash) for r in stored] == [r.leaf_hash for r in rows]
        assert [r.pk for r in stored] == [r.pk for r in rows]
        assert [r.as_record().pk for r in rows] == [r.pk for r in rows]
        payloads = {p.record_id: (p.fields_json, p.salt) for p in RecordPayload.objects.all()}
        assert {pk: payloads[pk] for pk in (rows[0].pk, rows[2].pk)} == {
            r.pk: (r.fields_json, r.salt) for r in (rows[0], rows[2])
        }
        assert rows[1].pk not in payloads  # a redacted stub has no payload row
        stream.refresh_from_db()
        assert (stream.head_hash, stream.head_seq, stream.length) == (rows[-1].h, rows[-1].seq, 3)
        # The next batch follows on, in this stream and the tenant's log.
        more = _rows(tenant_a, stream, 4, 2)
        assert _append(tenant_a, stream, more) == size + 3
        assert _log_size(tenant_a) == size + 5
    with tenant_context(tenant_b):  # another tenant's log is its own
        theirs = Stream.objects.create(tenant=tenant_b, stream_id="parity")
        size_b = _log_size(tenant_b)
        assert _append(tenant_b, theirs, _rows(tenant_b, theirs, 1, 2)) == size_b
    with tenant_context(tenant_a):
        assert _log_size(tenant_a) == size + 5


def test_a_tenants_first_records_create_its_log(db: None) -> None:
    tenant = Tenant.objects.create(slug="bare", name="Bare")  # no record yet: no log row
    with tenant_context(tenant):
        assert not TenantLog.objects.exists()
        stream = Stream.objects.create(tenant=tenant, stream_id="first")
        rows = _rows(tenant, stream, 1, 2)
        assert _append(tenant, stream, rows) == 0
        assert [r.leaf_index for r in rows] == [0, 1]
        assert _log_size(tenant) == 2
        assert Record.objects.count() == 2
