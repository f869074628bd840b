"""The read API: checkpoint, key, proofs and tiles, verified with the SDK as a client would."""

from __future__ import annotations

import base64

import pytest
from rest_framework.test import APIClient
from sagaplane import merkle, note

from tenants import services as tenant_services
from tenants.actors import named_actor
from tenants.inputs import NewApiKey
from tenants.models import Tenant
from tests.support.chains import Writer
from tests.support.factories import Person
from tests.support.scoping import in_tenant
from tests.support.transparency import settle

API = "/api/v1/audit"


def _b(values: list[str]) -> list[bytes]:
    return [base64.b64decode(v) for v in values]


@pytest.fixture
def log_a(tenant_a: Tenant, alice: Person, writer_a: Writer) -> tuple[note.Checkpoint, str]:
    writer_a.saga("s1")
    writer_a.saga("s2", steps=4)
    settle(tenant_a)
    client = alice.key_client()
    vkey = client.get(f"{API}/key").content.decode().splitlines()[0]
    response = client.get(f"{API}/checkpoint")
    assert response.status_code == 200 and response["Content-Type"].startswith("text/plain")
    return note.open_checkpoint(response.content.decode(), vkey, "sagaplane.local/acme"), vkey


def test_checkpoint_verifies_with_the_served_key(
    log_a: tuple[note.Checkpoint, str], tenant_a: Tenant
) -> None:
    from audit.models import Record
    from core.scoping import tenant_context

    checkpoint, vkey = log_a
    with tenant_context(tenant_a):
        assert checkpoint.size == Record.objects.count()
        assert Record.objects.filter(event="SAGA_SEALED").count() == 2
    assert vkey.startswith("sagaplane.local/acme+")


def test_every_inclusion_proof_from_the_api_verifies(
    log_a: tuple[note.Checkpoint, str], alice: Person
) -> None:
    checkpoint, _ = log_a
    client = alice.key_client()
    for index in range(checkpoint.size):
        body = client.get(f"{API}/proofs/inclusion", {"index": index, "size": checkpoint.size}).json()
        assert body["size"] == checkpoint.size and body["hash_encoding"] == "base64"
        merkle.verify_inclusion(
            base64.b64decode(body["leaf_hash"]),
            index,
            checkpoint.size,
            _b(body["hashes"]),
            checkpoint.root_hash,
        )
    # A proof with a wrong leaf hash is refused by the same verifier.
    with pytest.raises(merkle.InclusionProofError):
        merkle.verify_inclusion(b"\x00" * 32, 0, checkpoint.size, _b(body["hashes"]), checkpoint.root_hash)


def test_consistency_proofs_between_signed_sizes(
    log_a: tuple[note.Checkpoint, str], alice: Person, tenant_a: Tenant, writer_a: Writer
) -> None:
    old, vkey = log_a
    writer_a.saga("s3")
    settle(tenant_a)
    client = alice.session_client()
    new = note.open_checkpoint(client.get(f"{API}/checkpoint").content.decode(), vkey)
    assert new.size > old.size
    body = client.get(f"{API}/proofs/consistency", {"first": old.size, "second": new.size}).json()
    merkle.verify_consistency(old.size, new.size, _b(body["hashes"]), old.root_hash, new.root_hash)
    default = client.get(f"{API}/proofs/consistency", {"first": old.size}).json()
    assert default["second"] == new.size and default["hashes"] == body["hashes"]


@pytest.mark.parametrize(
    ("path", "params", "field", "error"),
    [
        ("inclusion", {}, "index", "invalid"),
        ("inclusion", {"index": "x"}, "index", "invalid"),
        ("inclusion", {"index": "-1"}, "index", "invalid"),
        ("inclusion", {"index": "0", "size": "1000"}, "size", "beyond_checkpoint"),
        ("inclusion", {"index": "5", "size": "5"}, "index", "out_of_range"),
        ("consistency", {"first": "0"}, "first", "invalid"),
        ("consistency", {"first": "5", "second": "4"}, "first", "invalid"),
        ("consistency", {"first": "5", "second": "1000"}, "second", "beyond_checkpoint"),
        ("consistency", {"second": "5"}, "first", "invalid"),
    ],
)
def test_bad_proof_parameters_name_the_field(
    log_a: tuple[note.Checkpoint, str], alice: Person, path: str, params: dict, field: str, error: str
) -> None:
    response = alice.key_client().get(f"{API}/proofs/{path}", params)
    assert response.status_code == 400, response.content
    assert response.json()["field"] == field and response.json()["error"] == error


def test_tiles_are_c2sp_and_give_the_same_proofs(log_a: tuple[note.Checkpoint, str], alice: Person) -> None:
    checkpoint, _ = log_a
    client = alice.key_client()
    fetched: dict[str, bytes] = {}

    def read_tile(level: int, index: int, width: int) -> bytes:
        path = merkle.tile_path(level, index, width)
        response = client.get(f"{API}/{path}")
        assert response.status_code == 200, (path, response.content)
        assert response["Content-Type"] == "application/octet-stream"
        fetched[path] = response.content
        return response.content

    reader = merkle.TileHashReader(read_tile, checkpoint.size)
    for index in range(checkpoint.size):
        proof = merkle.inclusion_proof(reader, index, checkpoint.size)
        api = _b(client.get(f"{API}/proofs/inclusion", {"index": index}).json()["hashes"])
        assert proof == api
    assert merkle.tree_root(reader, checkpoint.size) == checkpoint.root_hash
    assert len(fetched[f"tile/0/000.p/{checkpoint.size}"]) == 32 * checkpoint.size
    # Beyond the signed size, non-canonical paths and garbage are refused.
    assert client.get(f"{API}/tile/0/000.p/{checkpoint.size + 1}").status_code == 404
    assert client.get(f"{API}/tile/0/000").status_code == 404
    assert client.get(f"{API}/tile/0/x000/000.p/1").status_code == 400
    assert client.get(f"{API}/tile/0/abc").json()["field"] == "tile"


def test_viewers_and_read_keys_read_the_log_but_cannot_start_exports(
    log_a: tuple[note.Checkpoint, str], bob: Person
) -> None:
    _, read_key = in_tenant(
        tenant_services.create_api_key,
        bob.tenant,
        NewApiKey(name="reader", scopes=["read"]),
        actor=named_actor("test"),
    )
    read_only = APIClient()
    read_only.credentials(HTTP_AUTHORIZATION=f"Bearer {read_key}")
    for client in (bob.session_client(), read_only):
        assert client.get(f"{API}/proofs/inclusion", {"index": 0}).status_code == 200
        assert client.post(f"{API}/exports", {}, format="json").status_code == 403
        assert client.get(f"{API}/exports").status_code == 403


def test_reading_the_verifier_key_never_creates_one(tenant_a: Tenant, alice: Person) -> None:
    """Before its first checkpoint a tenant has no signing key; GET /key says so (404, JSON) and
    writes nothing (it used to create the key, unaudited, on a read)."""
    from core.scoping import tenant_context
    from transparency.models import LogSigningKey

    for client in (alice.key_client(), alice.session_client()):
        response = client.get(f"{API}/key")
        assert response.status_code == 404 and response.json()["error"] == "no_signing_key"
    with tenant_context(tenant_a):
        assert not LogSigningKey.objects.exists()


def test_another_tenant_gets_none_of_the_log(
    log_a: tuple[note.Checkpoint, str], carol: Person, tenant_b: Tenant, writer_b: Writer
) -> None:
    checkpoint, acme_key = log_a
    for client in (carol.key_client(), carol.session_client()):
        assert client.get(f"{API}/checkpoint").status_code == 404
        response = client.get(f"{API}/proofs/inclusion", {"index": 0, "size": checkpoint.size})
        assert response.status_code == 400 and response.json()["error"] == "beyond_checkpoint"
        assert client.get(f"{API}/tile/0/000.p/1").status_code == 404
    writer_b.saga("b1")
    settle(tenant_b)
    bravo_note = carol.key_client().get(f"{API}/checkpoint").content.decode()
    with pytest.raises(note.NoteError):
        note.open_checkpoint(bravo_note, acme_key)
    bravo_key = carol.key_client().get(f"{API}/key").content.decode().splitlines()[0]
    assert bravo_key != acme_key and bravo_key.startswith("sagaplane.local/bravo+")
