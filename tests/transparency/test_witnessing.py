"""Two real `sagaplane witness serve` processes cosign a tenant's log live: the control plane
sends each signed checkpoint with the consistency proof from the size each witness last
cosigned, retries from the size a 409 names, serves the cosignatures with the checkpoint, and
the offline verifiers enforce the tenant's policy (its quorum) on checkpoints, disclosures and
proof bundles. A witness that is down is a refusal on the witness's record and in /metrics, and
the checkpoint it did not cosign fails the policy with exit 3."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sagaplane import cli, cosignature, note

from core.scoping import tenant_context
from tenants.actors import named_actor
from tenants.models import Tenant
from tests.sdk.witnesskit import RunningWitness, start_witness
from tests.support.chains import Writer, server_stream
from tests.support.factories import Person
from tests.support.scoping import in_tenant
from tests.support.transparency import settle
from transparency import services as transparency_services
from transparency.models import Checkpoint, Export, Witness, WitnessRefusal
from transparency.storage import get_storage
from transparency.tasks import build_export_in, cosign_tenant

API = "/api/v1/audit"


@pytest.fixture
def witnessed(tenant_a: Tenant, alice: Person, writer_a: Writer, tmp_path: Path) -> Any:
    """Acme's log signed once, two witnesses trusting its key, added through the API, quorum 2."""
    writer_a.saga("s1")
    settle(tenant_a)
    vkey = alice.key_client().get(f"{API}/key").content.decode().splitlines()[0]
    origin = note.parse_verifier_key(vkey).name
    running = [start_witness(tmp_path / f"w{i}", f"witness.test/w{i}", [(origin, vkey)]) for i in (1, 2)]
    session = alice.session_client()
    for i, w in enumerate(running, start=1):
        answer = session.post(
            f"{API}/witnesses", {"name": f"w{i}", "url": w.url, "vkey": w.vkey}, format="json"
        )
        assert answer.status_code == 201, answer.content
    assert session.put(f"{API}/witnesses/quorum", {"quorum": 2}, format="json").status_code == 200
    yield running
    for w in running:
        w.stop()


def _policy(alice: Person, tmp_path: Path) -> str:
    path = tmp_path / "sagaplane.policy"
    path.write_text(alice.key_client().get(f"{API}/witnesses/policy").content.decode())
    return str(path)


def _save(tmp_path: Path, name: str, content: bytes) -> str:
    path = tmp_path / name
    path.write_bytes(content)
    return str(path)


def test_two_witnesses_cosign_and_the_policy_holds(
    tenant_a: Tenant,
    alice: Person,
    writer_a: Writer,
    witnessed: list[RunningWitness],
    tmp_path: Path,
    settings: Any,
) -> None:
    assert cosign_tenant(tenant_a.pk) == 2
    client = alice.key_client()
    checkpoint = client.get(f"{API}/checkpoint").content.decode()
    signed = note.parse_note(checkpoint)
    keys = [cosignature.parse_cosigner_vkey(w.vkey) for w in witnessed]
    assert set(cosignature.valid_cosignatures(signed.text, signed.signatures, keys)) == set(keys)
    policy = _policy(alice, tmp_path)
    assert (
        cli.main(["verify-checkpoint", _save(tmp_path, "cp", checkpoint.encode()), "--policy", policy]) == 0
    )

    # The log grows: each witness is sent the new checkpoint with a proof from what it cosigned.
    first_size = note.parse_checkpoint(signed.text).size
    writer_a.saga("s2", steps=3)
    settle(tenant_a)
    assert cosign_tenant(tenant_a.pk) == 2
    latest = client.get(f"{API}/witnesses/checkpoints").json()["witnesses"]
    assert [w["size"] > first_size for w in latest] == [True, True]
    for item in latest:  # each a checkpoint the witness itself would vouch for
        parsed = note.parse_note(item["checkpoint"])
        assert len(cosignature.valid_cosignatures(parsed.text, parsed.signatures, keys)) == 1

    # A saga's disclosure and a record's proof bundle verify under the policy (quorum 2).
    disclosure = client.get(f"{API}/sagas/s2/disclosure").content
    assert cli.main(["verify-disclosure", _save(tmp_path, "d.json", disclosure), "--policy", policy]) == 0
    timeline = alice.session_client().get("/sagas/s2/timeline").content.decode()
    assert f'href="{API}/proofs/bundle?index=' in timeline  # offered per record
    bundle = alice.session_client().get(f"{API}/proofs/bundle", {"index": first_size}).content
    assert cli.main(["verify-proof", _save(tmp_path, "p.tlog-proof", bundle), "--policy", policy]) == 0

    # A WORM export is proven against the witnessed checkpoint and verifies under the policy too.
    settings.SAGAPLANE_EXPORT_STORAGE = {
        "BACKEND": "transparency.storage.WriteOnceFileStorage",
        "OPTIONS": {"location": str(tmp_path / "exports")},
    }
    export = in_tenant(transparency_services.request_export, tenant_a, actor=named_actor("test"))
    build_export_in(tenant_a, export.pk)
    with tenant_context(tenant_a):
        stored = Export.objects.get(pk=export.pk)
    with get_storage().open(stored.storage_name) as src:
        archive = _save(tmp_path, "export.tar.gz", src.read())
    assert cli.main(["verify-export", archive, "--policy", policy]) == 0

    # Changes were audited with old and new values.
    events = {r.get("event"): r for r in server_stream(tenant_a)}
    assert events["ADMIN_WITNESS_ADDED"]["new"]["name"] in ("w1", "w2")
    assert events["ADMIN_WITNESS_QUORUM_SET"]["old"] == {"quorum": 0}
    assert events["ADMIN_WITNESS_QUORUM_SET"]["new"] == {"quorum": 2}


def test_a_409_names_the_size_to_retry_from(
    tenant_a: Tenant, alice: Person, writer_a: Writer, witnessed: list[RunningWitness]
) -> None:
    assert cosign_tenant(tenant_a.pk) == 2
    writer_a.saga("s2")
    settle(tenant_a)
    with tenant_context(tenant_a):  # the control plane lost what w1 cosigned: it asks from 0
        Witness.objects.filter(name="w1").update(cosigned_size=None, cosigned_checkpoint=None)
    assert cosign_tenant(tenant_a.pk) == 2  # w1: 409 with its size, then again from there: 200
    with tenant_context(tenant_a):
        latest = Checkpoint.objects.order_by("-id").first()
        assert latest is not None
        assert set(Witness.objects.values_list("cosigned_size", flat=True)) == {latest.size}
        assert not WitnessRefusal.objects.exists()


def test_a_down_witness_is_a_refusal_and_the_quorum_fails(
    tenant_a: Tenant, alice: Person, writer_a: Writer, witnessed: list[RunningWitness], tmp_path: Path
) -> None:
    assert cosign_tenant(tenant_a.pk) == 2
    witnessed[1].stop()  # SIGKILL
    writer_a.saga("s2")
    settle(tenant_a)
    assert cosign_tenant(tenant_a.pk) == 1
    with tenant_context(tenant_a):
        refusal = WitnessRefusal.objects.get()
        assert (refusal.witness_name, refusal.status) == ("w2", 0)
        w2 = Witness.objects.get(name="w2")
        assert w2.failures == 1 and w2.next_attempt_at > w2.created_at
    client = alice.key_client()
    policy = _policy(alice, tmp_path)
    checkpoint = _save(tmp_path, "cp", client.get(f"{API}/checkpoint").content)
    assert cli.main(["verify-checkpoint", checkpoint, "--policy", policy]) == cli.EXIT_QUORUM
    # Proof bundles of leaves the witnessed checkpoint covers are proven against it...
    assert (
        cli.main(
            [
                "verify-proof",
                _save(tmp_path, "old.tlog-proof", client.get(f"{API}/proofs/bundle", {"index": 0}).content),
                "--policy",
                policy,
            ]
        )
        == 0
    )
    # ...a newer leaf only against the latest, which the policy refuses.
    with tenant_context(tenant_a):
        latest = Checkpoint.objects.order_by("-id").first()
        assert latest is not None
    newest = client.get(f"{API}/proofs/bundle", {"index": latest.size - 1}).content
    assert (
        cli.main(["verify-proof", _save(tmp_path, "new.tlog-proof", newest), "--policy", policy])
        == cli.EXIT_QUORUM
    )
    listed = client.get(f"{API}/witnesses").json()
    assert listed["refusals"][0]["witness"] == "w2" and listed["refusals"][0]["status"] == 0
    metrics = alice.key_client().get("/metrics").content.decode()
    assert 'sagaplane_witness_refusals{code="unreachable"} 1.0' in metrics
    assert "sagaplane_witness_lag_seconds" in metrics


def test_witness_changes_are_validated_and_audited(tenant_a: Tenant, alice: Person, bob: Person) -> None:
    session = alice.session_client()
    vkey = cosignature.generate_cosigner("witness.test/x").verifier.encode()
    bad = [
        ({"name": "", "url": "http://127.0.0.1:1", "vkey": vkey}, "name"),
        ({"name": "x", "url": "ftp://example.com", "vkey": vkey}, "url"),
        ({"name": "x", "url": "http://127.0.0.1:1", "vkey": "nope"}, "vkey"),
        ({"name": "x", "url": "http://127.0.0.1:1", "vkey": note.generate_key("a.test/k")[1]}, "vkey"),
    ]
    for body, field in bad:
        answer = session.post(f"{API}/witnesses", body, format="json")
        assert answer.status_code == 400 and answer.json()["field"] == field, answer.content
    created = session.post(
        f"{API}/witnesses", {"name": "x", "url": "http://127.0.0.1:1", "vkey": vkey}, format="json"
    )
    assert created.status_code == 201
    again = session.post(
        f"{API}/witnesses", {"name": "y", "url": "http://127.0.0.1:1", "vkey": vkey}, format="json"
    )
    assert again.status_code == 409
    assert session.put(f"{API}/witnesses/quorum", {"quorum": 2}, format="json").status_code == 400
    assert session.put(f"{API}/witnesses/quorum", {"quorum": 1}, format="json").status_code == 200
    assert bob.session_client().delete(f"{API}/witnesses/{created.json()['id']}").status_code == 403  # viewer
    assert session.delete(f"{API}/witnesses/{created.json()['id']}").status_code == 204
    assert session.get(f"{API}/witnesses").json()["quorum"] == 0  # lowered with the last witness
    removed = [r for r in server_stream(tenant_a) if r.get("event") == "ADMIN_WITNESS_REMOVED"][0]
    assert removed["old"]["witness"]["name"] == "x" and removed["old"]["quorum"] == 1
    assert removed["new"] == {"witness": None, "quorum": 0}


def test_witness_urls_pass_the_outbound_guard(tenant_a: Tenant, alice: Person, settings: Any) -> None:
    settings.SAGAPLANE_WEBHOOK_ALLOW_PRIVATE = False
    vkey = cosignature.generate_cosigner("witness.test/x").verifier.encode()
    answer = alice.session_client().post(
        f"{API}/witnesses", {"name": "x", "url": "http://169.254.169.254/", "vkey": vkey}, format="json"
    )
    assert answer.status_code == 400 and answer.json()["error"] == "unsafe_url"


@pytest.mark.django_db(transaction=True)
def test_the_beat_threads_pass_cosigns_with_no_worker_running(
    tenant_a: Tenant, alice: Person, writer_a: Writer, witnessed: list[RunningWitness]
) -> None:
    """Liveness: the integrator's queued request sits in the broker (no worker runs here, as when
    every worker is busy); the beat process's own loop finds the witnesses behind and cosigns, in
    threads of its own (their own database connections)."""
    from concurrent.futures import ThreadPoolExecutor

    from transparency import cosigner, cross_tenant

    writer_a.saga("s2")
    settle(tenant_a)
    assert cross_tenant.tenants_to_cosign() == [tenant_a.pk]
    with ThreadPoolExecutor(max_workers=2) as pool:
        assert cosigner.pass_once(pool) == 1
    assert cross_tenant.tenants_to_cosign() == []
    with tenant_context(tenant_a):
        latest = Checkpoint.objects.order_by("-id").first()
        assert latest is not None
        assert set(Witness.objects.values_list("cosigned_checkpoint_id", flat=True)) == {latest.pk}
