"""`sagaplane witness serve`, as a real process, answers POST /add-checkpoint exactly as C2SP
tlog-witness says: each status code the spec names is provoked here and checked, the state
survives a SIGKILL, concurrent requests from one old size get one cosignature, and a validly signed
inconsistent checkpoint is kept as evidence."""

from __future__ import annotations

import base64
import hashlib
import http.client
import json
import subprocess
import sys
import threading
import urllib.parse
from pathlib import Path

import pytest
from sagaplane import cosignature, note

from tests.sdk.witnesskit import FakeLog, RunningWitness, start_witness

NAME = "witness.test/w1"


@pytest.fixture
def log() -> FakeLog:
    return FakeLog("sagaplane.test/acme")


@pytest.fixture
def other() -> FakeLog:
    return FakeLog("sagaplane.test/other")


@pytest.fixture
def witness(tmp_path: Path, log: FakeLog, other: FakeLog):
    running = start_witness(tmp_path / "w", NAME, [(log.origin, log.vkey), (other.origin, other.vkey)])
    yield running
    running.stop()


def _cosigners(witness: RunningWitness) -> list[cosignature.CosignatureVerifier]:
    return [cosignature.parse_cosigner_vkey(v) for v in witness.vkeys]


def _check_cosigned(witness: RunningWitness, checkpoint: str, body: str) -> None:
    assert body and all(line.startswith("\u2014 ") for line in body.splitlines()) and body.endswith("\n")
    signed = note.parse_note(checkpoint + body)
    valid = cosignature.valid_cosignatures(signed.text, signed.signatures, _cosigners(witness))
    assert set(valid) == set(_cosigners(witness))  # every key of the witness cosigned
    assert all(timestamp > 0 for timestamp in valid.values())  # never 0


def test_init_prints_a_type_0x04_vkey(witness: RunningWitness) -> None:
    ed25519 = cosignature.parse_cosigner_vkey(witness.vkey)
    assert ed25519.alg == cosignature.ALG_COSIGNATURE_V1 and ed25519.name == NAME
    assert base64.b64decode(witness.vkey.split("+", 2)[2])[0] == 0x04
    assert (witness.directory / "witness.key").stat().st_mode & 0o077 == 0  # owner only


def test_first_checkpoint_then_consistent_growth_is_cosigned(witness: RunningWitness, log: FakeLog) -> None:
    log.grow(8)
    first = log.checkpoint()
    status, _, body = witness.post(log.request(0, first))
    assert status == 200
    _check_cosigned(witness, first, body)
    log.grow(5)
    grown = log.checkpoint()
    status, _, body = witness.post(log.request(8, grown))
    assert status == 200
    _check_cosigned(witness, grown, body)
    again = log.checkpoint()  # same size, same root: cosigned again
    status, _, body = witness.post(log.request(13, again))
    assert status == 200
    _check_cosigned(witness, again, body)


def test_unknown_origin_is_404(witness: RunningWitness) -> None:
    stranger = FakeLog("sagaplane.test/stranger")
    stranger.grow(2)
    assert witness.post(stranger.request(0))[0] == 404


def test_no_trusted_signature_is_403(witness: RunningWitness, log: FakeLog) -> None:
    log.grow(3)
    impostor = note.generate_signer(log.origin)  # same origin, another key
    forged = note.sign_checkpoint(note.Checkpoint(log.origin, 3, log.tree.root()), impostor)
    assert witness.post(log.request(0, forged))[0] == 403
    # The trusted key's name and id, but a signature that does not verify: also 403.
    good = log.checkpoint()
    text, _, sig_line = good.rpartition("\u2014 ")
    name, data = sig_line.split()
    raw = bytearray(base64.b64decode(data))
    raw[-1] ^= 1
    tampered = f"{text}\u2014 {name} {base64.b64encode(bytes(raw)).decode()}\n"
    assert witness.post(log.request(0, tampered))[0] == 403


def test_old_size_above_the_checkpoint_is_400(witness: RunningWitness, log: FakeLog) -> None:
    log.grow(4)
    assert witness.post(log.request(5, log.checkpoint(), proof=[]))[0] == 400
    assert witness.post(b"not a request")[0] == 400
    assert witness.post(f"old 01\n\n{log.checkpoint()}")[0] == 400  # leading zero


def test_wrong_old_size_is_409_with_the_latest_size(witness: RunningWitness, log: FakeLog) -> None:
    log.grow(6)
    status, content_type, body = witness.post(log.request(3))
    assert (status, content_type, body) == (409, "text/x.tlog.size", "0\n")
    assert witness.post(log.request(0))[0] == 200
    log.grow(2)
    status, content_type, body = witness.post(log.request(0, log.checkpoint(), proof=[]))
    assert (status, content_type, body) == (409, "text/x.tlog.size", "6\n")
    # The client retries from the size it was told, with the proof from there.
    assert witness.post(log.request(6))[0] == 200


def test_inconsistent_checkpoints_are_422_and_kept_as_evidence(
    witness: RunningWitness, log: FakeLog, other: FakeLog
) -> None:
    log.grow(8)
    assert witness.post(log.request(0))[0] == 200
    # A fork: the same first 8 leaves' checkpoint was cosigned, now a tree that rewrote leaf 7.
    fork = FakeLog(log.origin)
    fork.signer = log.signer
    fork.grow(7)
    fork.grow(5, tag="forked ")
    proof = fork.tree.consistency_proof(8, 12)
    status, _, _ = witness.post(fork.request(8, fork.checkpoint(), proof=proof))
    assert status == 422  # the proof reproduces the fork's 8-leaf root, not the cosigned one
    # The same size, another root (a split view).
    split = log.checkpoint(8, hashlib.sha256(b"another history").digest())
    assert witness.post(log.request(8, split, proof=[]))[0] == 422
    # A bad proof for an honest extension.
    log.grow(4)
    honest = log.tree.consistency_proof(8, 12)
    honest[0] = bytes(32)
    assert witness.post(log.request(8, log.checkpoint(), proof=honest))[0] == 422
    # From 0, the proof must be empty; and an empty tree has the empty root.
    other.grow(3)
    assert witness.post(other.request(0, other.checkpoint(), proof=[other.tree.leaf(0)]))[0] == 422
    assert witness.post(other.request(0, other.checkpoint(0, bytes(32)), proof=[]))[0] == 422
    assert witness.post(other.request(0, other.checkpoint(0, hashlib.sha256().digest()), proof=[]))[0] == 200
    # Nothing refused moved the state: the honest extension with its real proof is cosigned.
    assert witness.post(log.request(8))[0] == 200

    out = subprocess.run(
        [sys.executable, "-m", "sagaplane", "witness", "evidence", "--dir", str(witness.directory)],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(Path(__file__).resolve().parents[2] / "sdk")},
        timeout=120,
    )
    assert out.returncode == 1, out.stderr  # evidence held: a failing exit for scripts
    evidence = json.loads(out.stdout)
    assert len(evidence) == 5
    assert {item["origin"] for item in evidence} == {log.origin, other.origin}
    split_view = evidence[1]
    assert "different root" in split_view["reason"] and split_view["cosigned"]["size"] == 8
    # Each is validly signed by the log: evidence a third party can check with the log's key.
    for item in evidence:
        keys = log.vkey if item["origin"] == log.origin else other.vkey
        note.open_checkpoint(item["note"], keys)


def test_state_survives_sigkill(tmp_path: Path, log: FakeLog) -> None:
    first = start_witness(tmp_path / "w", NAME, [(log.origin, log.vkey)])
    log.grow(5)
    assert first.post(log.request(0))[0] == 200
    first.stop()  # SIGKILL right after the answer
    second = start_witness(tmp_path / "w", NAME, [(log.origin, log.vkey)])
    try:
        assert second.post(log.request(0)) == (409, "text/x.tlog.size", "5\n")
        origin_hash = hashlib.sha256(log.origin.encode()).hexdigest()
        parts = urllib.parse.urlsplit(second.url)
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
        conn.request("GET", f"/{origin_hash}/checkpoint")
        response = conn.getresponse()
        served = response.read().decode()
        assert response.status == 200
        signed = note.parse_note(served)
        assert note.parse_checkpoint(signed.text).size == 5
        assert len(cosignature.valid_cosignatures(signed.text, signed.signatures, _cosigners(second))) >= 1
    finally:
        second.stop()


def test_concurrent_requests_from_one_old_size_get_one_cosignature(tmp_path: Path, log: FakeLog) -> None:
    """The race tlog-witness describes: requests for sizes N and N+K both checked against the same
    state. Two processes on one state folder, eight threads: exactly one is cosigned, every other
    is told the size that won (409), and the stored state is the winner's."""
    a = start_witness(tmp_path / "w", NAME, [(log.origin, log.vkey)])
    b = start_witness(tmp_path / "w", NAME, [(log.origin, log.vkey)])
    try:
        log.grow(4)
        assert a.post(log.request(0))[0] == 200
        requests = []
        for _ in range(8):
            log.grow(1)
            requests.append((log.tree.size, log.request(4)))
        answers: dict[int, tuple[int, str, str]] = {}
        barrier = threading.Barrier(len(requests))

        def send(i: int, size: int, body: str) -> None:
            barrier.wait(timeout=60)
            answers[size] = (a if i % 2 else b).post(body)

        threads = [threading.Thread(target=send, args=(i, s, body)) for i, (s, body) in enumerate(requests)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        winners = [size for size, answer in answers.items() if answer[0] == 200]
        assert len(answers) == 8 and len(winners) == 1, answers
        for size, answer in answers.items():
            if size != winners[0]:
                assert answer == (409, "text/x.tlog.size", f"{winners[0]}\n")
        assert a.post(log.request(0, log.checkpoint(), proof=[])) == (
            409,
            "text/x.tlog.size",
            f"{winners[0]}\n",
        )
    finally:
        a.stop()
        b.stop()
