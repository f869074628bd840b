"""Saga disclosures: fetched through the API, verified offline by the SDK (and its CLI), and
every tampered copy refused with its reason."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from sagaplane import cli, note
from sagaplane.disclosure import VerificationError, verify_disclosure

from audit import services as audit_services
from core.scoping import tenant_context
from tenants.actors import named_actor, user_actor
from tenants.models import Tenant
from tests.support.chains import Writer
from tests.support.factories import Person
from tests.support.scoping import in_tenant
from tests.support.transparency import settle

API = "/api/v1/audit"


def _fetch(person: Person, saga_id: str) -> dict[str, Any]:
    response = person.key_client().get(f"{API}/sagas/{saga_id}/disclosure")
    assert response.status_code == 200, response.content
    return response.json()


@pytest.fixture
def world(tenant_a: Tenant, alice: Person, writer_a: Writer) -> dict[str, Any]:
    other = Writer(tenant_a, "agent-a-2")
    writer_a.ship(("SAGA_START", {"saga_id": "pay-1", "name": "pay"}))
    other.saga("other-1")
    writer_a.ship(
        (
            "STEP_INTENT",
            {"saga_id": "pay-1", "step_id": "a", "tool": "payments.charge", "kwargs": {"amount": 42}},
        ),
        ("STEP_COMMITTED", {"saga_id": "pay-1", "step_id": "a", "tool": "payments.charge"}),
    )
    writer_a.ship(("SAGA_COMPLETE", {"saga_id": "pay-1"}))
    settle(tenant_a)
    old_note = alice.key_client().get(f"{API}/checkpoint").content.decode()
    other.saga("other-2")
    settle(tenant_a)
    key = alice.key_client().get(f"{API}/key").content.decode().splitlines()[0]
    return {
        "bundle": _fetch(alice, "pay-1"),
        "other": _fetch(alice, "other-1"),
        "key": key,
        "old_note": old_note,
    }


def test_a_real_disclosure_verifies(
    world: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    bundle, key = world["bundle"], world["key"]
    report = verify_disclosure(bundle, key)
    assert report.records == 4 and report.saga_id == "pay-1"
    assert [r["record"]["event"] for r in bundle["records"]] == [
        "SAGA_START",
        "STEP_INTENT",
        "STEP_COMMITTED",
        "SAGA_COMPLETE",
    ]
    assert all(r["record"].get("saga_id") == "pay-1" for r in bundle["records"])  # nothing of other sagas
    assert "other-1" not in json.dumps(bundle)
    path = tmp_path / "disclosure.json"
    path.write_text(json.dumps(bundle))
    assert cli.main(["verify-disclosure", str(path), "--key", key]) == 0
    assert "OK:" in capsys.readouterr().out


def _drop_second(b: dict) -> None:
    del b["records"][1]


def _add_foreign(b: dict, other: dict) -> None:
    b["records"].append(other["records"][0])
    b["records"].sort(key=lambda r: r["leaf_index"])


def _reorder(b: dict) -> None:
    b["records"][1], b["records"][2] = b["records"][2], b["records"][1]


def _payload_byte(b: dict) -> None:
    b["records"][1]["record"]["kwargs"]["amount"] = 43


TAMPERS = {
    "payload byte changed": (_payload_byte, "content digest"),
    "record dropped": (_drop_second, "missing from the disclosure"),
    "reordered": (_reorder, "out of leaf order"),
    "seal edited": (lambda b: b["seal"]["record"]["leaves"].pop(), "content digest"),
    "proof hash flipped": (
        lambda b: b["records"][0]["inclusion"].__setitem__(0, "A" * 43 + "="),
        "not included in the checkpoint",
    ),
    "leaf index moved": (lambda b: b["records"][0].__setitem__("leaf_index", 0), "not included"),
}


@pytest.mark.parametrize("name", sorted(TAMPERS))
def test_tampered_disclosures_are_refused(world: dict[str, Any], name: str) -> None:
    tamper, reason = TAMPERS[name]
    bundle = copy.deepcopy(world["bundle"])
    tamper(bundle)
    with pytest.raises(VerificationError, match=reason):
        verify_disclosure(bundle, world["key"])


def test_a_record_of_another_saga_is_refused(world: dict[str, Any]) -> None:
    bundle = copy.deepcopy(world["bundle"])
    _add_foreign(bundle, world["other"])
    with pytest.raises(VerificationError, match="belongs to saga 'other-1'"):
        verify_disclosure(bundle, world["key"])


def test_an_older_checkpoint_is_refused(world: dict[str, Any]) -> None:
    bundle = copy.deepcopy(world["bundle"])
    assert bundle["checkpoint"] != world["old_note"]
    bundle["checkpoint"] = world["old_note"]
    with pytest.raises(VerificationError, match="not included in the checkpoint"):
        verify_disclosure(bundle, world["key"])


def test_another_tenants_key_does_not_verify_it(
    world: dict[str, Any], carol: Person, tenant_b: Tenant, writer_b: Writer, tmp_path: Path
) -> None:
    writer_b.saga("b-1")
    settle(tenant_b)
    bravo_key = carol.key_client().get(f"{API}/key").content.decode().splitlines()[0]
    with pytest.raises(VerificationError, match="signature does not verify"):
        verify_disclosure(world["bundle"], bravo_key)
    # ...nor can bravo fetch acme's saga, and a note re-signed with bravo's key is refused too.
    assert carol.key_client().get(f"{API}/sagas/pay-1/disclosure").status_code == 404
    bravo_bundle = _fetch(carol, "b-1")
    forged = copy.deepcopy(world["bundle"])
    forged["checkpoint"] = bravo_bundle["checkpoint"]
    with pytest.raises(VerificationError):
        verify_disclosure(forged, world["key"])
    path = tmp_path / "d.json"
    path.write_text(json.dumps(world["bundle"]))
    assert cli.main(["verify-disclosure", str(path), "--key", bravo_key]) == 1


def test_unsealed_and_unknown_sagas(tenant_a: Tenant, alice: Person, writer_a: Writer) -> None:
    writer_a.saga("running", end=None)
    settle(tenant_a)
    response = alice.key_client().get(f"{API}/sagas/running/disclosure")
    assert response.status_code == 409 and response.json()["error"] == "not_sealed"
    assert alice.key_client().get(f"{API}/sagas/nope/disclosure").status_code == 404


def test_erasure_keeps_the_disclosure_verifying(
    world: dict[str, Any], tenant_a: Tenant, alice: Person
) -> None:
    step = world["bundle"]["records"][1]
    with tenant_context(tenant_a):
        audit_services.redact(
            tenant_a, step["stream"], position=step["position"], reason="gdpr", actor=named_actor("test")
        )
    settle(tenant_a)
    bundle = _fetch(alice, "pay-1")
    report = verify_disclosure(bundle, world["key"])
    assert report.records == 4 and report.redacted == 1
    erased = bundle["records"][1]
    assert erased["record"].get("_redacted") and "kwargs" not in erased["record"]
    assert erased["record"]["_h"] == step["record"]["_h"]
    assert [erased["leaf_index"], erased["record"]["_h"]] in bundle["seal"]["record"]["leaves"]
    assert bundle["seal"]["record"]["count"] == 4


def test_a_record_after_the_seal_gets_a_new_seal(
    world: dict[str, Any], tenant_a: Tenant, alice: Person
) -> None:
    in_tenant(
        audit_services.append_server_record,
        tenant_a,
        "APPROVAL_GRANTED",
        {"saga_id": "pay-1", "request": "r1"},
        actor=user_actor("alice"),
    )
    settle(tenant_a)
    bundle = _fetch(alice, "pay-1")
    assert verify_disclosure(bundle, world["key"]).records == 5
    assert bundle["seal"]["leaf_index"] > world["bundle"]["seal"]["leaf_index"]


def test_cli_with_both_keys_during_rotation(
    world: dict[str, Any], tenant_a: Tenant, alice: Person, tmp_path: Path
) -> None:
    from transparency import services

    in_tenant(services.rotate_signing_key, tenant_a, actor=named_actor("test"))
    new_key = alice.key_client().get(f"{API}/key").content.decode().splitlines()[0]
    path = tmp_path / "d.json"
    path.write_text(json.dumps(_fetch(alice, "pay-1")))
    assert cli.main(["verify-disclosure", str(path), "--key", new_key]) == 0
    assert cli.main(["verify-disclosure", str(path), "--key", world["key"]]) == 0
    assert isinstance(note.parse_verifier_key(new_key), note.Verifier)
