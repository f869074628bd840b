"""A split view caught: after a witness cosigned the tenant's checkpoint of size N, the control
plane (an operator holding the log's key) presents it another checkpoint of the same size with
another root. The witness refuses (422), keeps the validly signed checkpoint as evidence, and the
refusal shows on the Evidence page and in /metrics; auditors holding the policy never see the
forged checkpoint cosigned."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

from sagaplane import note

from core.scoping import tenant_context
from tenants.models import Tenant
from tests.sdk.witnesskit import ROOT, start_witness
from tests.support.chains import Writer
from tests.support.factories import Person
from tests.support.transparency import settle
from transparency import keys
from transparency.actions import signing
from transparency.models import Checkpoint, Cosignature, WitnessRefusal
from transparency.tasks import cosign_tenant

API = "/api/v1/audit"


def test_a_second_history_of_the_same_size_is_refused_and_kept(
    tenant_a: Tenant, alice: Person, writer_a: Writer, tmp_path: Path
) -> None:
    writer_a.saga("s1")
    settle(tenant_a)
    vkey = alice.key_client().get(f"{API}/key").content.decode().splitlines()[0]
    origin = keys.log_origin(tenant_a)
    witness = start_witness(tmp_path / "w1", "witness.test/w1", [(origin, vkey)])
    try:
        session = alice.session_client()
        added = session.post(
            f"{API}/witnesses", {"name": "w1", "url": witness.url, "vkey": witness.vkey}, format="json"
        )
        assert added.status_code == 201
        assert session.put(f"{API}/witnesses/quorum", {"quorum": 1}, format="json").status_code == 200
        assert cosign_tenant(tenant_a.pk) == 1
        with tenant_context(tenant_a):
            honest = Checkpoint.objects.order_by("-id").first()
            assert honest is not None
            # The operator signs another tree of the same size with the tenant's own key.
            other_root = hashlib.sha256(b"the history shown to someone else").digest()
            forged_note = note.sign_checkpoint(
                note.Checkpoint(origin, honest.size, other_root), signing.key_signers()
            )
            forged = Checkpoint.objects.create(
                tenant=tenant_a, size=honest.size, root=other_root, note=forged_note
            )
        assert cosign_tenant(tenant_a.pk) == 0

        with tenant_context(tenant_a):
            refusal = WitnessRefusal.objects.get()
            assert (refusal.status, refusal.size, refusal.checkpoint_id) == (422, honest.size, forged.pk)
            assert "different root" in refusal.detail
            assert not Cosignature.objects.filter(checkpoint=forged).exists()  # never cosigned
        # The witness kept the validly signed inconsistent checkpoint: evidence anyone can check.
        out = subprocess.run(
            [sys.executable, "-m", "sagaplane", "witness", "evidence", "--dir", str(witness.directory)],
            capture_output=True,
            text=True,
            env={"PYTHONPATH": str(ROOT / "sdk")},
            timeout=120,
        )
        assert out.returncode == 1
        (kept,) = json.loads(out.stdout)
        assert kept["note"] == forged_note and kept["cosigned"]["size"] == honest.size
        assert note.open_checkpoint(kept["note"], vkey).root_hash == other_root
        assert note.open_checkpoint(kept["cosigned"]["note"], vkey).root_hash == bytes(honest.root)

        page = session.get("/evidence/").content.decode()
        assert "Split view caught" in page and "answered 422" in page
        metrics = alice.key_client().get("/metrics").content.decode()
        assert 'sagaplane_witness_refusals{code="422"} 1.0' in metrics
    finally:
        witness.stop()
