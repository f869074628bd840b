"""The transparency log's vendor SQL (transparency/queries.py) answers the same on every database:
each test asserts one answer, and the suite runs it on Postgres and on SQLite."""

from __future__ import annotations

import pytest
from sagaplane import merkle

from audit.models import Record
from core.scoping import tenant_context
from tenants.models import Tenant
from tests.support.chains import Writer
from transparency import queries
from transparency.models import Checkpoint

pytestmark = pytest.mark.django_db


def _node(level: int, index: int) -> merkle.Node:
    return merkle.Node(level, index, bytes([level, index % 256]) * 16)


def test_inserted_nodes_are_read_back_by_position_for_their_tenant_only(
    tenant_a: Tenant, tenant_b: Tenant
) -> None:
    ours = [_node(0, i) for i in range(5)] + [_node(1, 0), _node(1, 1), _node(2, 0)]
    with tenant_context(tenant_a):
        queries.insert_nodes(tenant_a.pk, ours)
    with tenant_context(tenant_b):
        queries.insert_nodes(tenant_b.pk, [merkle.Node(0, 0, b"\xff" * 32)])
    wanted = [(0, 0), (1, 1), (2, 0), (0, 4), (3, 0)]  # (3, 0) is stored by nobody
    with tenant_context(tenant_a):
        rows, latest = queries.tree_nodes(tenant_a.pk, wanted, with_latest=False)
    assert latest is None
    assert sorted((level, index, bytes(digest)) for level, index, digest in rows) == sorted(
        (n.level, n.index, n.hash) for n in ours if (n.level, n.index) in wanted
    )


def test_many_nodes_are_read_in_one_answer(tenant_a: Tenant) -> None:
    """More nodes than SQLite's compound SELECT takes in one statement (read in chunks there)."""
    ours = [_node(0, i) for i in range(450)]
    with tenant_context(tenant_a):
        queries.insert_nodes(tenant_a.pk, ours)
        rows, _ = queries.tree_nodes(tenant_a.pk, [(0, i) for i in range(450)], with_latest=False)
    assert sorted((level, index, bytes(digest)) for level, index, digest in rows) == [
        (n.level, n.index, n.hash) for n in ours
    ]


def test_the_latest_signed_size_is_read_beside_the_nodes(tenant_a: Tenant, tenant_b: Tenant) -> None:
    with tenant_context(tenant_a):
        queries.insert_nodes(tenant_a.pk, [_node(0, 0)])
        assert queries.tree_nodes(tenant_a.pk, [(0, 0)], with_latest=True)[1] is None
        Checkpoint.objects.create(tenant=tenant_a, size=1, root=b"\x01" * 32, note="one")
        Checkpoint.objects.create(tenant=tenant_a, size=7, root=b"\x07" * 32, note="seven")
    with tenant_context(tenant_b):
        Checkpoint.objects.create(tenant=tenant_b, size=9, root=b"\x09" * 32, note="nine")
    with tenant_context(tenant_a):
        rows, latest = queries.tree_nodes(tenant_a.pk, [(0, 0), (0, 1)], with_latest=True)
        assert latest == 7
        assert [(level, index, bytes(digest)) for level, index, digest in rows] == [(0, 0, _node(0, 0).hash)]
        assert queries.tree_nodes(tenant_a.pk, [], with_latest=True) == ([], 7)


def test_leaf_hashes_are_the_tenants_own_in_leaf_order(
    tenant_a: Tenant, tenant_b: Tenant, writer_a: Writer, writer_b: Writer
) -> None:
    writer_b.saga("theirs", steps=1)
    writer_a.saga("ours", steps=2)
    with tenant_context(tenant_a):
        stored = [bytes(h) for h in Record.objects.order_by("leaf_index").values_list("leaf_hash", flat=True)]
        assert len(stored) >= 6
        assert queries.leaf_hashes(tenant_a.pk, 0, len(stored)) == stored
        assert queries.leaf_hashes(tenant_a.pk, 2, 5) == stored[2:5]
        # Past the log's end: what there is (the integrator refuses a short answer).
        assert queries.leaf_hashes(tenant_a.pk, 1, len(stored) + 10) == stored[1:]
        assert queries.leaf_hashes(tenant_a.pk, len(stored), len(stored) + 3) == []
