"""Entry bundles (C2SP tlog-tiles `tile/entries/<N>[.p/<W>]`): each entry is a big-endian uint16
length and the leaf data; hashing each with leaf_hash gives the level-0 hash tile."""

from __future__ import annotations

from typing import Any

import pytest
from sagaplane import merkle
from sagaplane.chain import GENESIS, stamp
from sagaplane.leaf import leaf_data

from audit import services as audit_services
from core.scoping import tenant_context
from tenants.actors import named_actor
from tenants.models import Tenant
from tests.support.chains import Writer
from tests.support.factories import Person
from tests.support.scoping import in_tenant
from tests.support.transparency import settle

API = "/api/v1/audit"


def _entries(bundle: bytes) -> list[bytes]:
    out, offset = [], 0
    while offset < len(bundle):
        length = int.from_bytes(bundle[offset : offset + 2], "big")
        out.append(bundle[offset + 2 : offset + 2 + length])
        offset += 2 + length
    assert offset == len(bundle), "trailing bytes after the last entry"
    return out


def _get(person: Person, path: str) -> bytes:
    response = person.key_client().get(f"{API}/{path}")
    assert response.status_code == 200, (path, response.content)
    assert response["Content-Type"] == "application/octet-stream"
    return response.content


def _size(alice: Person) -> int:
    return int(alice.key_client().get(f"{API}/checkpoint").content.decode().split("\n")[1])


def test_partial_bundle_hashes_to_the_level0_tile(tenant_a: Tenant, alice: Person, writer_a: Writer) -> None:
    writer_a.saga("s1")
    settle(tenant_a)
    size = _size(alice)
    entries = _entries(_get(alice, merkle.entries_tile_path(0, size)))
    tile = _get(alice, merkle.tile_path(0, 0, size))
    assert len(entries) == size
    assert b"".join(merkle.leaf_hash(e) for e in entries) == tile
    # The entries are the leaf data of the records, in leaf order.
    from audit.models import Record

    with tenant_context(tenant_a):
        rows = list(Record.objects.select_related("stream").order_by("leaf_index"))
    assert entries == [leaf_data(r.stream.stream_id, r.position, r.h) for r in rows]
    # A narrower partial bundle is a prefix; wider than the signed log is refused.
    assert _entries(_get(alice, merkle.entries_tile_path(0, 2))) == entries[:2]
    assert alice.key_client().get(f"{API}/{merkle.entries_tile_path(0, size + 1)}").status_code == 404
    assert alice.key_client().get(f"{API}/tile/entries/000").status_code == 404  # not full yet


def _fill_to(tenant: Tenant, count: int) -> None:
    """Ship plain records until the log has at least `count` leaves."""
    from audit.models import TenantLog

    with tenant_context(tenant):
        have = TenantLog.objects.values_list("size", flat=True).first() or 0
    head, batch = GENESIS, []
    for seq in range(1, count - have + 1):
        record: dict[str, Any] = {"seq": seq, "ts": 1700000000 + seq, "event": "NOTE", "n": seq}
        head = stamp(record, head)
        batch.append(record)
    in_tenant(audit_services.ingest, tenant, "filler", batch, actor=named_actor("test"))


def test_full_bundle_and_the_next_partial(tenant_a: Tenant, alice: Person) -> None:
    _fill_to(tenant_a, 300)
    settle(tenant_a)
    size = _size(alice)
    assert size >= 300
    full = _entries(_get(alice, "tile/entries/000"))
    assert len(full) == 256
    assert b"".join(merkle.leaf_hash(e) for e in full) == _get(alice, "tile/0/000")
    rest = _entries(_get(alice, merkle.entries_tile_path(1, size - 256)))
    assert b"".join(merkle.leaf_hash(e) for e in rest) == _get(alice, merkle.tile_path(0, 1, size - 256))
    # The whole log, rebuilt from entry bundles alone, has the signed root.
    from sagaplane import note

    checkpoint = note.parse_note(alice.key_client().get(f"{API}/checkpoint").content.decode())
    root = merkle.root_from_leaf_hashes(merkle.leaf_hash(e) for e in full + rest)
    assert note.parse_checkpoint(checkpoint.text).root_hash == root


def test_a_leaf_that_disagrees_with_its_node_is_not_served(
    tenant_a: Tenant, alice: Person, writer_a: Writer
) -> None:
    writer_a.saga("s1")
    settle(tenant_a)
    size = _size(alice)
    from transparency.models import TreeNode

    with tenant_context(tenant_a):
        # The record store is append-only (a trigger on Postgres), so break the tree side instead.
        assert TreeNode.objects.filter(level=0, index=1).update(hash=b"\x07" * 32) == 1
    response = alice.key_client().get(f"{API}/{merkle.entries_tile_path(0, size)}")
    assert response.status_code == 500 and response.json()["error"] == "inconsistent"


@pytest.mark.parametrize("path", ["tile/entries/abc", "tile/entries/x000/000.p/1", "tile/entries/000.p/0"])
def test_bad_bundle_paths(tenant_a: Tenant, alice: Person, writer_a: Writer, path: str) -> None:
    writer_a.saga("s1")
    settle(tenant_a)
    response = alice.key_client().get(f"{API}/{path}")
    assert response.status_code == 400 and response.json()["field"] == "tile"


def test_another_tenant_gets_no_entries(
    tenant_a: Tenant, alice: Person, carol: Person, writer_a: Writer
) -> None:
    writer_a.saga("s1")
    settle(tenant_a)
    assert carol.key_client().get(f"{API}/tile/entries/000.p/1").status_code == 404
