"""`sagaplane verify-approval`: a passkey vote's assertion, as the server keeps it, re-verified
offline with the SDK alone; every tampering fails, naming what broke."""

from __future__ import annotations

import copy
import hashlib
import json
import secrets
import time
from pathlib import Path
from typing import Any

import pytest
from sagaplane import cli
from sagaplane.approval import verify_approvals
from sagaplane.chain import stamp
from sagaplane.disclosure import FORMAT, VerificationError

from passkeys import services
from tenants.actors import named_actor
from tests.passkeys.authenticator import ORIGIN, SoftAuthenticator, b64url, unb64url
from tests.support.factories import Person

pytestmark = pytest.mark.django_db

ACTION = {"tool": "bank.wire", "arguments": {"amount": 250000, "to": "ACME GmbH"}, "amount": "250000"}


def vote_record(person: Person, auth: SoftAuthenticator, *, digest: str | None = None, **get: Any) -> dict:
    """A vote as the approvals app records it: its action digest, and the verified assertion
    with the challenge (SHA-256 of digest ‖ nonce) and the nonce."""
    action_digest = digest or hashlib.sha256(json.dumps(ACTION, sort_keys=True).encode()).hexdigest()
    nonce = secrets.token_bytes(32)
    challenge = hashlib.sha256(bytes.fromhex(action_digest) + nonce).digest()
    verified = services.verify_assertion(person.user, challenge, auth.get(challenge, **get), origins=[ORIGIN])
    return {
        "event": "APPROVAL_VOTE",
        "saga_id": "saga-wire-1",
        "step_id": "wire",
        "tool": "bank.wire",
        "approval_id": "req-1",
        "action_digest": action_digest,
        "voter": f"user:{person.user.email}",
        "role": person.role,
        "choice": "approve",
        "note": "",
        "assertion": {**verified.as_record(), "challenge": challenge.hex(), "nonce": nonce.hex()},
        "actor": f"user:{person.user.email}",
    }


def bundle(*records: dict) -> dict:
    entries, prev = [], "0" * 64
    for seq, business in enumerate(records, start=1):
        record = {"seq": seq, "ts": time.time(), **business}
        prev = stamp(record, prev)
        entries.append({"leaf_index": seq, "stream": "server", "position": seq, "record": record})
    return {"format": FORMAT, "saga_id": "saga-wire-1", "records": entries}


def restamp(record: dict) -> dict:
    """A forger who recomputes the record's digest and hash after changing it (without the log's
    key nothing else notices; the assertion's own checks must)."""
    fresh = {k: v for k, v in record.items() if not k.startswith("_")}
    stamp(fresh, record["_ph"])
    return fresh


@pytest.fixture
def enrolled(alice: Person) -> SoftAuthenticator:
    auth = SoftAuthenticator()
    services.register(
        alice.user,
        "laptop",
        auth.create(services.registration_options(alice.user)),
        origins=[ORIGIN],
        actor=named_actor("t"),
    )
    return auth


def test_a_passkey_vote_verifies_offline_from_the_cli(
    alice: Person, enrolled: SoftAuthenticator, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    requested = {
        "event": "APPROVAL_REQUESTED",
        "saga_id": "saga-wire-1",
        "approval_id": "req-1",
        "action_digest": vote_record(alice, enrolled)["action_digest"],
        "action": ACTION,
    }
    path = tmp_path / "disclosure.json"
    path.write_text(json.dumps(bundle(requested, vote_record(alice, enrolled))))
    assert cli.main(["verify-approval", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("OK: ") and "1 passkey vote(s) verified" in out and "ES256" in out
    assert "user:alice@acme.example approve req-1" in out


def test_ed25519_votes_verify_too(alice: Person) -> None:
    auth = SoftAuthenticator(algorithm="EdDSA")
    services.register(
        alice.user,
        "key",
        auth.create(services.registration_options(alice.user)),
        origins=[ORIGIN],
        actor=named_actor("t"),
    )
    report = verify_approvals(bundle(vote_record(alice, auth)))
    assert [v.algorithm for v in report.votes] == ["EdDSA"]


def flip_last_byte(text: str) -> str:
    raw = bytearray(unb64url(text))
    raw[-1] ^= 1
    return b64url(bytes(raw))


TAMPERINGS = {
    "signature": (lambda a: a.update(signature=flip_last_byte(a["signature"])), "does not verify"),
    "authenticator data (counter)": (
        lambda a: a.update(authenticator_data=flip_last_byte(a["authenticator_data"])),
        "does not verify",
    ),
    "another public key": (
        lambda a: a.update(public_key=b64url(SoftAuthenticator().cose_key())),
        "does not verify",
    ),
    "the nonce": (lambda a: a.update(nonce=secrets.token_hex(32)), "another action"),
    "the relying party": (lambda a: a.update(rp_id="evil.example"), "another relying party"),
}


@pytest.mark.parametrize("what", list(TAMPERINGS))
def test_a_tampered_assertion_fails(what: str, alice: Person, enrolled: SoftAuthenticator) -> None:
    record = bundle(vote_record(alice, enrolled))["records"][0]["record"]
    forged = copy.deepcopy(record)
    change, message = TAMPERINGS[what]
    change(forged["assertion"])
    with pytest.raises(VerificationError, match="digest"):
        verify_approvals(bundle_of(forged))  # as altered: its own digest gives it away
    with pytest.raises(VerificationError, match=message):
        verify_approvals(bundle_of(restamp(forged)))  # re-stamped: the assertion gives it away


def bundle_of(record: dict) -> dict:
    return {
        "format": FORMAT,
        "saga_id": "saga-wire-1",
        "records": [{"leaf_index": 1, "stream": "server", "position": 1, "record": record}],
    }


def test_a_vote_moved_to_another_action_fails(alice: Person, enrolled: SoftAuthenticator) -> None:
    record = bundle(vote_record(alice, enrolled))["records"][0]["record"]
    moved = restamp({**record, "action_digest": hashlib.sha256(b"wire(1000000)").hexdigest()})
    with pytest.raises(VerificationError, match="another action"):
        verify_approvals(bundle_of(moved))
    requested = {"event": "APPROVAL_REQUESTED", "approval_id": "req-1", "action_digest": "ab" * 32}
    with pytest.raises(VerificationError, match="asked for"):
        verify_approvals(
            bundle(
                requested,
                {k: v for k, v in record.items() if not k.startswith("_") and k != "seq" and k != "ts"},
            )
        )


def test_without_user_verification_fails_offline(alice: Person, enrolled: SoftAuthenticator) -> None:
    record = bundle(vote_record(alice, enrolled))["records"][0]["record"]
    # A vote the server would never have accepted: re-signed by the key's holder without UV.
    auth_data = bytearray(unb64url(record["assertion"]["authenticator_data"]))
    auth_data[32] &= ~0x04
    client_data = unb64url(record["assertion"]["client_data_json"])
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    signature = enrolled.key.sign(
        bytes(auth_data) + hashlib.sha256(client_data).digest(), ec.ECDSA(hashes.SHA256())
    )
    forged = copy.deepcopy(record)
    forged["assertion"].update(authenticator_data=b64url(bytes(auth_data)), signature=b64url(signature))
    with pytest.raises(VerificationError, match="UV flag clear"):
        verify_approvals(bundle_of(restamp(forged)))


def test_the_cli_names_the_failure_and_exits_1(
    alice: Person, enrolled: SoftAuthenticator, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    record = bundle(vote_record(alice, enrolled))["records"][0]["record"]
    forged = copy.deepcopy(record)
    forged["assertion"]["signature"] = flip_last_byte(forged["assertion"]["signature"])
    path = tmp_path / "forged.json"
    path.write_text(json.dumps(bundle_of(restamp(forged))))
    assert cli.main(["verify-approval", str(path)]) == 1
    assert "FAILED" in capsys.readouterr().out
    path.write_text("not json")
    assert cli.main(["verify-approval", str(path)]) == 1
