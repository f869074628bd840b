"""Offline proof files (C2SP tlog-proof v1): served per leaf against the latest signed
checkpoint (no witnesses here), the record as extra data, verified offline by the SDK and
`sagaplane verify-proof`, tampered copies refused."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
from sagaplane import cli, merkle, note
from sagaplane.tlogproof import HEADER, ProofFileError, format_proof, parse_proof, verify_proof

from core.scoping import tenant_context
from tenants.models import Tenant
from tests.support.chains import Writer
from tests.support.factories import Person
from tests.support.transparency import settle

API = "/api/v1/audit"


@pytest.fixture
def log_a(tenant_a: Tenant, alice: Person, writer_a: Writer) -> tuple[str, list[bytes]]:
    writer_a.saga("s1")
    writer_a.saga("s2", steps=4)
    settle(tenant_a)
    from audit.models import Record

    with tenant_context(tenant_a):
        leaves = [bytes(h) for h in Record.objects.order_by("leaf_index").values_list("leaf_hash", flat=True)]
    vkey = alice.key_client().get(f"{API}/key").content.decode().splitlines()[0]
    return vkey, leaves


def _bundle(person: Person, index: int) -> str:
    response = person.key_client().get(f"{API}/proofs/bundle", {"index": index})
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain")
    return response.content.decode()


def test_every_leaf_has_a_verifying_proof_file(log_a: tuple[str, list[bytes]], alice: Person) -> None:
    vkey, leaves = log_a
    checkpoint = alice.key_client().get(f"{API}/checkpoint").content.decode()
    for index, leaf in enumerate(leaves):
        text = _bundle(alice, index)
        head, _, rest = text.partition("\n\n")
        lines = head.split("\n")
        assert lines[0] == HEADER == "c2sp.org/tlog-proof@v1" and lines[2] == f"index {index}"
        assert lines[1].startswith("extra ")  # the record, from which the leaf hash is computed
        assert rest == checkpoint  # the signed note, verbatim
        assert [base64.b64decode(h) for h in lines[3:]] == merkle.MemoryTree(leaves).inclusion_proof(
            index, len(leaves)
        )
        report = verify_proof(text, vkey, leaf_hash=leaf, origin="sagaplane.local/acme")
        assert (report.index, report.checkpoint.size) == (index, len(leaves))
        carried = verify_proof(text, vkey)  # the leaf hash from the record it carries
        assert carried.record is not None and carried.index == index
        with pytest.raises(ProofFileError, match="inclusion proof"):
            verify_proof(text, vkey, leaf_hash=leaves[index - 1] if index else leaves[1])


def test_the_cli_verifies_and_refuses(
    log_a: tuple[str, list[bytes]], alice: Person, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    vkey, leaves = log_a
    path = tmp_path / "leaf-3.tlog-proof"
    path.write_text(_bundle(alice, 3))
    assert cli.main(["verify-proof", str(path), "--key", vkey, "--leaf-hash", leaves[3].hex()]) == 0
    assert "OK:" in capsys.readouterr().out
    assert cli.main(["verify-proof", str(path), "--key", vkey, "--leaf-hash", leaves[4].hex()]) == 1
    assert "FAILED:" in capsys.readouterr().out
    assert cli.main(["verify-proof", str(path), "--key", vkey, "--leaf-hash", "zz"]) == 2


def _tamper_hash(text: str) -> str:
    lines = text.split("\n")
    digest = bytearray(base64.b64decode(lines[3]))  # after the header, the extra and the index
    digest[0] ^= 1
    lines[3] = base64.b64encode(bytes(digest)).decode()
    return "\n".join(lines)


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("proof hash flipped", "inclusion proof"),
        ("index changed", "inclusion proof"),
        ("proof hash dropped", "inclusion proof"),
        ("header changed", "first line"),
        ("checkpoint size edited", "checkpoint"),
        ("index past the checkpoint", "beyond the checkpoint"),
        ("non-canonical index", "canonical"),
    ],
)
def test_tampered_proof_files_are_refused(
    log_a: tuple[str, list[bytes]], alice: Person, name: str, reason: str
) -> None:
    vkey, leaves = log_a
    text = _bundle(alice, 5)
    size = len(leaves)
    tampered = {
        "proof hash flipped": _tamper_hash,
        "index changed": lambda t: t.replace("\nindex 5\n", "\nindex 4\n"),
        "proof hash dropped": lambda t: "\n".join(t.split("\n")[:3] + t.split("\n")[4:]),
        "header changed": lambda t: t.replace(HEADER, "c2sp.org/tlog-proof@v2"),
        "checkpoint size edited": lambda t: t.replace(f"\n{size}\n", f"\n{size + 1}\n"),
        "index past the checkpoint": lambda t: t.replace("\nindex 5\n", f"\nindex {size}\n"),
        "non-canonical index": lambda t: t.replace("\nindex 5\n", "\nindex 05\n"),
    }[name](text)
    assert tampered != text
    with pytest.raises(ProofFileError, match=reason):
        verify_proof(tampered, vkey, leaf_hash=leaves[5])
    verify_proof(text, vkey, leaf_hash=leaves[5])  # the untampered file still verifies


def test_another_tenants_key_is_refused(
    log_a: tuple[str, list[bytes]], alice: Person, carol: Person, tenant_b: Tenant, writer_b: Writer
) -> None:
    _, leaves = log_a
    writer_b.saga("b1")
    settle(tenant_b)
    bravo_key = carol.key_client().get(f"{API}/key").content.decode().splitlines()[0]
    with pytest.raises(ProofFileError, match="checkpoint"):
        verify_proof(_bundle(alice, 0), bravo_key, leaf_hash=leaves[0])


def test_format_round_trip_with_extra_and_empty_proof() -> None:
    signer = note.generate_signer("example.com/log")
    leaf = merkle.leaf_hash(b"only entry")
    signed = note.sign_checkpoint(note.Checkpoint("example.com/log", 1, leaf), signer)
    text = format_proof(0, [], signed, extra=b"context")
    assert text.startswith(f"{HEADER}\nextra {base64.b64encode(b'context').decode()}\nindex 0\n\n")
    parsed = parse_proof(text)
    assert (parsed.index, parsed.hashes, parsed.extra, parsed.checkpoint) == (0, (), b"context", signed)
    assert verify_proof(text, signer.verifier, leaf_data=b"only entry").checkpoint.size == 1
    with pytest.raises(ProofFileError):
        verify_proof(text, signer.verifier, leaf_data=b"another entry")


def test_bad_requests(log_a: tuple[str, list[bytes]], alice: Person, carol: Person) -> None:
    _, leaves = log_a
    client = alice.key_client()
    assert client.get(f"{API}/proofs/bundle").json()["field"] == "index"
    assert client.get(f"{API}/proofs/bundle", {"index": "x"}).status_code == 400
    response = client.get(f"{API}/proofs/bundle", {"index": len(leaves)})
    assert response.status_code == 400 and response.json()["error"] == "out_of_range"
    # Bravo has no checkpoint: nothing of acme's log is served to it.
    response = carol.key_client().get(f"{API}/proofs/bundle", {"index": 0})
    assert response.status_code == 404 and response.json()["error"] == "no_checkpoint"
