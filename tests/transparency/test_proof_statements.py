"""Proofs on Postgres are one statement: the nodes and the latest signed size read together,
planned against the latest size this process saw. A newer checkpoint must be noticed."""

from __future__ import annotations

import base64

from sagaplane import merkle, note

from core.scoping import tenant_context
from tenants.models import Tenant
from tests.support.chains import Writer
from tests.support.factories import Person
from tests.support.transparency import settle
from transparency import proofs

API = "/api/v1/audit"


def test_proofs_follow_a_newly_signed_checkpoint(tenant_a: Tenant, alice: Person, writer_a: Writer) -> None:
    writer_a.saga("s1")
    settle(tenant_a)
    client = alice.key_client()
    vkey = client.get(f"{API}/key").content.decode().splitlines()[0]
    first = note.open_checkpoint(client.get(f"{API}/checkpoint").content.decode(), vkey)
    assert client.get(f"{API}/proofs/inclusion", {"index": 0}).json()["size"] == first.size
    with tenant_context(tenant_a):
        assert proofs.inclusion(0)[0] == first.size  # this process has seen `first.size` now

    writer_a.saga("s2", steps=3)
    settle(tenant_a)
    second = note.open_checkpoint(client.get(f"{API}/checkpoint").content.decode(), vkey)
    assert second.size > first.size
    # With no size given, the new latest checkpoint answers, not the size seen before.
    body = client.get(f"{API}/proofs/inclusion", {"index": second.size - 1}).json()
    assert body["size"] == second.size
    merkle.verify_inclusion(
        base64.b64decode(body["leaf_hash"]),
        second.size - 1,
        second.size,
        [base64.b64decode(h) for h in body["hashes"]],
        second.root_hash,
    )
    body = client.get(f"{API}/proofs/consistency", {"first": first.size}).json()
    assert body["second"] == second.size
    hashes = [base64.b64decode(h) for h in body["hashes"]]
    merkle.verify_consistency(first.size, second.size, hashes, first.root_hash, second.root_hash)
    with tenant_context(tenant_a):
        assert proofs.consistency(first.size)[0] == second.size
    # An old size is still served; one past the latest is refused, naming the field.
    old = client.get(f"{API}/proofs/inclusion", {"index": 0, "size": first.size}).json()
    assert old["size"] == first.size
    refused = client.get(f"{API}/proofs/inclusion", {"index": 0, "size": second.size + 1})
    assert refused.status_code == 400 and refused.json()["field"] == "size"
    refused = client.get(f"{API}/proofs/inclusion", {"index": second.size})
    assert refused.status_code == 400 and refused.json()["field"] == "index"
