"""C2SP signed notes and checkpoints (sagaplane.note)."""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Callable

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sagaplane.note import (
    Checkpoint,
    MalformedCheckpointError,
    MalformedKeyError,
    MalformedNoteError,
    NoteError,
    SignatureError,
    Signer,
    Verifier,
    format_checkpoint,
    generate_key,
    generate_signer,
    key_id,
    open_checkpoint,
    parse_checkpoint,
    parse_note,
    parse_signer_key,
    parse_verifier_key,
    sign_checkpoint,
    sign_note,
    verify_note,
)

ORIGIN = "sagaplane.example/tenant/acme"
ROOT = hashlib.sha256(b"root").digest()
CHECKPOINT = Checkpoint(ORIGIN, 42, ROOT)

# Known-answer vector published in the documentation of Go's golang.org/x/mod/sumdb/note:
# proves byte-for-byte interoperability of key strings, key ids and signature lines.
GO_SKEY = "PRIVATE+KEY+PeterNeumann+c74f20a3+AYEKFALVFGyNhPJEMzD1QIDr+Y7hfZx09iUvxdXHKDFz"
GO_VKEY = "PeterNeumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW"
GO_TEXT = (
    "If you think cryptography is the answer to your problem,\nthen you don't know what your problem is.\n"
)
GO_SIG = "x08go/ZJkuBS9UG/SffcvIAQxVBtiFupLLr8pAcElZInNIuGUgYN1FFYC2pZSNXgKvqfqdngotpRZb6KE6RyyBwJnAM="


@pytest.fixture(scope="module")
def signer() -> Signer:
    return generate_signer(ORIGIN)


@pytest.fixture(scope="module")
def signed(signer: Signer) -> str:
    return sign_checkpoint(CHECKPOINT, signer)


def _resign_body(signed: str, body: str) -> str:
    # Keep the original signature line but swap the body it claims to cover.
    return body + "\n" + signed.split("\n\n", 1)[1]


# --------------------------------------------------------------------------- format and key ids


def test_checkpoint_body_format() -> None:
    assert CHECKPOINT.body() == f"{ORIGIN}\n42\n{base64.b64encode(ROOT).decode()}\n"


def test_signed_note_layout(signer: Signer, signed: str) -> None:
    body, sigs = signed.split("\n\n")
    assert body + "\n" == CHECKPOINT.body()
    assert sigs.startswith("\u2014 " + ORIGIN + " ")
    assert sigs.endswith("\n") and sigs.count("\n") == 1
    raw = base64.b64decode(sigs[:-1].split(" ")[2])
    assert len(raw) == 4 + 64 and raw[:4] == signer.key_id


def test_key_id_matches_spec_formula() -> None:
    # Computed here from the spec, independently of sagaplane.note:
    # SHA-256(name || 0x0A || 0x01 || 32-byte public key)[:4].
    seed = bytes(range(32))
    pub = Ed25519PrivateKey.from_private_bytes(seed).public_key().public_bytes_raw()
    name = "log.example/a"
    expected = hashlib.sha256(name.encode() + b"\x0a" + b"\x01" + pub).digest()[:4]
    assert key_id(name, pub) == expected
    s = Signer.from_seed(name, seed)
    assert s.key_id == expected
    pub_b64 = base64.b64encode(bytes([1]) + pub).decode()
    seed_b64 = base64.b64encode(bytes([1]) + seed).decode()
    assert s.verifier_key == f"{name}+{expected.hex()}+{pub_b64}"
    assert s.encode() == f"PRIVATE+KEY+{name}+{expected.hex()}+{seed_b64}"


def test_go_known_answer() -> None:
    s = parse_signer_key(GO_SKEY)
    assert s.encode() == GO_SKEY
    assert s.verifier_key == GO_VKEY
    assert parse_verifier_key(GO_VKEY).key_id.hex() == "c74f20a3"
    msg = sign_note(GO_TEXT, GO_SKEY)
    assert msg == GO_TEXT + "\n\u2014 PeterNeumann " + GO_SIG + "\n"
    assert verify_note(msg, GO_VKEY).text == GO_TEXT


def test_key_strings_round_trip() -> None:
    skey, vkey = generate_key("round.trip")
    s = parse_signer_key(skey)
    assert s.encode() == skey and s.verifier_key == vkey
    assert parse_verifier_key(vkey).encode() == vkey
    # The key is PRIVATE+KEY+<name>+<key id>+<base64>; base64 itself may hold "+", so split 4 times.
    secret = skey.split("+", 4)[4]
    assert "seed" not in repr(s) and secret not in repr(s)


# --------------------------------------------------------------------------- round trips


def test_sign_verify_round_trip(signer: Signer, signed: str) -> None:
    note = verify_note(signed, signer.verifier_key)
    assert note.text == CHECKPOINT.body()
    assert open_checkpoint(signed, signer.verifier, origin=ORIGIN) == CHECKPOINT
    assert open_checkpoint(signed.encode(), signer.verifier) == CHECKPOINT


def test_rotation_with_two_keys(signer: Signer) -> None:
    new = generate_signer(ORIGIN)  # Same name, new key: rotation keeps the origin.
    msg = sign_checkpoint(CHECKPOINT, [signer, new.encode()])
    assert len(parse_note(msg).signatures) == 2
    assert open_checkpoint(msg, signer.verifier) == CHECKPOINT
    assert open_checkpoint(msg, new.verifier_key) == CHECKPOINT
    assert open_checkpoint(msg, [new.verifier, signer.verifier]) == CHECKPOINT
    # After rotation, a note signed by the new key alone satisfies a "new or old" verifier set.
    only_new = sign_checkpoint(CHECKPOINT, new)
    assert open_checkpoint(only_new, [signer.verifier, new.verifier]) == CHECKPOINT
    with pytest.raises(SignatureError):
        open_checkpoint(only_new, signer.verifier)
    with pytest.raises(MalformedKeyError):
        sign_checkpoint(CHECKPOINT, [signer, signer])


def test_unknown_signatures_are_ignored(signer: Signer, signed: str) -> None:
    other = generate_signer("witness.example")
    msg = sign_checkpoint(CHECKPOINT, [other, signer])
    assert open_checkpoint(msg, signer.verifier) == CHECKPOINT
    # A garbage signature by an unknown key does not matter either.
    junk = "\u2014 someone " + base64.b64encode(b"\x00" * 68).decode() + "\n"
    assert open_checkpoint(signed + junk, signer.verifier) == CHECKPOINT


# --------------------------------------------------------------------------- refusals


def test_wrong_key_refused(signed: str) -> None:
    other = generate_signer(ORIGIN)
    with pytest.raises(SignatureError):
        verify_note(signed, other.verifier)


def test_key_from_another_name_refused(signer: Signer, signed: str) -> None:
    # Same public key, different name: different key id, so no signature matches.
    renamed = Verifier.from_public_key("other.example/log", signer.public_key)
    with pytest.raises(SignatureError):
        verify_note(signed, renamed)
    # And a signature line whose name was edited does not verify under that name.
    forged = signed.replace(f"\u2014 {ORIGIN} ", "\u2014 other.example/log ")
    with pytest.raises(SignatureError):
        verify_note(forged, renamed)


@pytest.mark.parametrize(
    "body",
    [
        Checkpoint(ORIGIN, 43, ROOT).body(),
        Checkpoint(ORIGIN, 41, ROOT).body(),
        Checkpoint(ORIGIN, 42, hashlib.sha256(b"other").digest()).body(),
        Checkpoint(ORIGIN + "x", 42, ROOT).body(),
        Checkpoint(ORIGIN, 42, ROOT, ("ext",)).body(),
    ],
    ids=["size+1", "size-1", "root", "origin", "extension"],
)
def test_altered_body_refused(signed: str, signer: Signer, body: str) -> None:
    with pytest.raises(SignatureError):
        verify_note(_resign_body(signed, body), signer.verifier)


def test_tampered_signature_refused(signed: str, signer: Signer) -> None:
    body, line = signed.split("\n\n")
    prefix, data = line[:-1].rsplit(" ", 1)
    raw = bytearray(base64.b64decode(data))
    raw[10] ^= 1
    bad = f"{body}\n\n{prefix} {base64.b64encode(bytes(raw)).decode()}\n"
    with pytest.raises(SignatureError):
        verify_note(bad, signer.verifier)
    # A bad line by the expected key is refused even next to a good one.
    with pytest.raises(SignatureError):
        verify_note(signed + f"{prefix} {base64.b64encode(bytes(raw)).decode()}\n", signer.verifier)


@pytest.mark.parametrize(
    "mutate",
    [
        lambda s: s.replace("\n\n", "\n"),  # no blank line
        lambda s: s[:-1],  # signature block without final newline
        lambda s: s.split("\n\n")[0] + "\n\n",  # no signatures at all
        lambda s: s.replace("\u2014 ", "- "),  # hyphen instead of em dash
        lambda s: s.replace("\u2014 ", "\u2014"),  # no space after the dash
        lambda s: s[:-2] + "\n",  # signature lost its base64 padding
        lambda s: s[:-3] + "!=\n",  # not base64
        lambda s: s[:-1] + " extra\n",  # extra field
        lambda s: s.replace("42\n", "4\r2\n", 1),  # control character in text
        lambda s: s.split("\n\n")[0] + "\n\n\u2014 name AAAA\n",  # signature too short
        lambda s: s + ("\u2014 x " + base64.b64encode(b"\x00" * 68).decode() + "\n") * 101,
    ],
    ids=[
        "no-blank",
        "no-final-newline",
        "no-signatures",
        "hyphen",
        "no-space",
        "padding",
        "not-base64",
        "extra-field",
        "control-char",
        "short-sig",
        "too-many",
    ],
)
def test_malformed_notes_refused(signed: str, signer: Signer, mutate: Callable[[str], str]) -> None:
    with pytest.raises(MalformedNoteError):
        parse_note(mutate(signed))
    with pytest.raises(NoteError):
        verify_note(mutate(signed), signer.verifier)


def test_non_utf8_refused(signed: str, signer: Signer) -> None:
    with pytest.raises(MalformedNoteError):
        verify_note(b"\xff" + signed.encode(), signer.verifier)


def test_signing_invalid_text_refused(signer: Signer) -> None:
    for text in ["no newline", "tab\there\n", ""]:
        with pytest.raises(MalformedNoteError):
            sign_note(text, signer)


# --------------------------------------------------------------------------- checkpoints and keys


B64 = base64.b64encode(ROOT).decode()


@pytest.mark.parametrize(
    "body",
    [
        f"{ORIGIN}\n42\n{B64}",  # missing trailing newline
        f"{ORIGIN}\n42\n",  # missing root
        f"\n42\n{B64}\n",  # empty origin
        f"{ORIGIN}\n-1\n{B64}\n",
        f"{ORIGIN}\n+42\n{B64}\n",
        f"{ORIGIN}\n042\n{B64}\n",
        f"{ORIGIN}\n4_2\n{B64}\n",
        f"{ORIGIN}\n \n{B64}\n",
        f"{ORIGIN}\n\u0664\u0662\n{B64}\n",  # Arabic-Indic digits: int() would accept them
        f"{ORIGIN}\n0x2a\n{B64}\n",
        f"{ORIGIN}\n{1 << 64}\n{B64}\n",
        f"{ORIGIN}\n42\n{B64[:-1]}\n",  # bad padding
        f"{ORIGIN}\n42\n{B64.replace('=', '')}\n",
        f"{ORIGIN}\n42\n{B64[:-2]}*=\n",
        f"{ORIGIN}\n42\n{base64.b64encode(ROOT[:31]).decode()}\n",  # 31-byte root
        f"{ORIGIN}\n42\n{base64.b64encode(ROOT + b'x').decode()}\n",
        f"{ORIGIN}\n42\n{B64}\n\n",  # empty extension line
    ],
)
def test_malformed_checkpoints_refused(body: str) -> None:
    with pytest.raises(MalformedCheckpointError):
        parse_checkpoint(body)


def test_checkpoint_parse_and_extensions() -> None:
    body = f"{ORIGIN}\n0\n{B64}\nextra line\n"
    cp = parse_checkpoint(body)
    assert (cp.origin, cp.size, cp.root_hash, cp.extensions) == (ORIGIN, 0, ROOT, ("extra line",))
    assert cp.body() == body
    assert format_checkpoint(ORIGIN, 42, ROOT) == CHECKPOINT.body()
    with pytest.raises(MalformedCheckpointError):
        format_checkpoint(ORIGIN, 42, ROOT[:31])


def test_open_checkpoint_checks_origin(signer: Signer, signed: str) -> None:
    with pytest.raises(MalformedCheckpointError):
        open_checkpoint(signed, signer.verifier, origin="elsewhere")
    # A validly signed note whose body is not a checkpoint is still refused.
    with pytest.raises(MalformedCheckpointError):
        open_checkpoint(sign_note("hello\n", signer), signer.verifier)


@pytest.mark.parametrize(
    "vkey",
    [
        "",
        "name",
        "name+c74f20a3",
        "bad name+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW",
        "PeterNeumann+c74f20a4+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW",  # wrong id
        "PeterNeumann+c74f20a+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW",  # short id
        "PeterNeumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10T!",  # bad base64
        "PeterNeumann+c74f20a3+AhpC2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW",  # algorithm 0x02
        "PeterNeumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy1w==",  # short key
        "Peter+Neumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW",
    ],
)
def test_malformed_verifier_keys_refused(vkey: str) -> None:
    with pytest.raises(MalformedKeyError):
        parse_verifier_key(vkey)


@pytest.mark.parametrize(
    "skey",
    [
        GO_VKEY,
        "PRIVATE+KEY+PeterNeumann+c74f20a4+AYEKFALVFGyNhPJEMzD1QIDr+Y7hfZx09iUvxdXHKDFz",  # wrong id
        "PRIVATE+KEY+Other+c74f20a3+AYEKFALVFGyNhPJEMzD1QIDr+Y7hfZx09iUvxdXHKDFz",  # wrong name
        "PUBLIC+KEY+PeterNeumann+c74f20a3+AYEKFALVFGyNhPJEMzD1QIDr+Y7hfZx09iUvxdXHKDFz",
    ],
)
def test_malformed_signer_keys_refused(skey: str) -> None:
    with pytest.raises(MalformedKeyError):
        parse_signer_key(skey)
