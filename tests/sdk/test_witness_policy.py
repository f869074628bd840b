"""C2SP tlog-policy parsing and quorum checks, and the verifiers' --policy: a checkpoint not
cosigned by the policy's quorum is refused with its own exit code and a sentence."""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

import pytest
from sagaplane import cli, cosignature, note, tlogproof
from sagaplane.policy import PolicyError, QuorumError, format_policy, parse_policy

from tests.sdk.witnesskit import FakeLog


def _witnesses(count: int, alg: int = cosignature.ALG_COSIGNATURE_V1) -> list[cosignature.Cosigner]:
    return [cosignature.generate_cosigner(f"witness.test/w{i}", alg) for i in range(count)]


def _cosigned(log: FakeLog, cosigners: list[cosignature.Cosigner]) -> str:
    signed = log.checkpoint()
    return signed + cosignature.cosign(note.parse_note(signed).text, cosigners)


def _policy(log: FakeLog, cosigners: list[cosignature.Cosigner], quorum: int) -> str:
    return format_policy(
        [log.vkey], [(f"W{i}", c.verifier.encode(), "") for i, c in enumerate(cosigners)], quorum
    )


def test_quorum_of_two_of_three() -> None:
    log, ws = FakeLog(), _witnesses(3)
    log.grow(5)
    policy = parse_policy(_policy(log, ws, 2))
    witnessed = policy.check(_cosigned(log, ws[:2]))
    assert witnessed.witnesses == ("W0", "W1") and witnessed.checkpoint.size == 5
    with pytest.raises(QuorumError, match="cosigned by W2, which does not meet"):
        policy.check(_cosigned(log, ws[2:]))
    with pytest.raises(QuorumError, match="no witness of the policy"):
        policy.check(log.checkpoint())
    outsider = _witnesses(1)[0]  # same name as W0, another key: ignored, not counted
    with pytest.raises(QuorumError):
        policy.check(_cosigned(log, [outsider, ws[1]]))


def test_ml_dsa_44_cosignatures_count() -> None:
    log, ws = FakeLog(), _witnesses(2, cosignature.ALG_MLDSA44)
    log.grow(3)
    assert base64.b64decode(ws[0].verifier.encode().split("+", 2)[2])[0] == 0x06
    assert parse_policy(_policy(log, ws, 2)).check(_cosigned(log, ws)).witnesses == ("W0", "W1")


def test_a_forged_cosignature_by_a_known_key_fails() -> None:
    log, ws = FakeLog(), _witnesses(2)
    log.grow(2)
    text = _cosigned(log, ws)
    lines = text.splitlines(keepends=True)
    name, data = lines[-1][2:].split()
    raw = bytearray(base64.b64decode(data))
    raw[-1] ^= 1
    lines[-1] = f"\u2014 {name} {base64.b64encode(bytes(raw)).decode()}\n"
    with pytest.raises(note.SignatureError):
        parse_policy(_policy(log, ws, 1)).check("".join(lines))


def test_groups_and_none() -> None:
    log, ws = FakeLog(), _witnesses(4)
    log.grow(1)
    text = "\n".join(
        [f"log {log.vkey}"]
        + [f"witness W{i} {w.verifier.encode()}" for i, w in enumerate(ws)]
        + ["group X 2 W0 W1", "group Y any W2 W3", "group XY all X Y", "quorum XY", ""]
    )
    policy = parse_policy(text)
    policy.check(_cosigned(log, [ws[0], ws[1], ws[3]]))
    with pytest.raises(QuorumError):
        policy.check(_cosigned(log, [ws[0], ws[2], ws[3]]))
    parse_policy(f"log {log.vkey}\nquorum none\n").check(log.checkpoint())


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("quorum W\n", "not defined above"),
        ("witness W {w0}\nwitness W {w1}\nquorum W\n", "already defined"),
        ("witness A {w0}\nwitness B {w0}\nquorum A\n", "duplicate key"),
        ("witness A {w0}\ngroup G 2 A\nquorum G\n", "threshold"),
        ("witness A {w0}\ngroup G any A A\nquorum G\n", "twice"),
        ("witness A {w0}\n", "no quorum"),
        ("witness A {w0}\nquorum A\nquorum A\n", "second quorum"),
        ("witness A notakey\nquorum A\n", "line 1"),
        ("frobnicate\nquorum none\n", "not a log"),
        ("quorum none\x01\n", "control character"),
    ],
)
def test_malformed_policies_are_refused(text: str, match: str) -> None:
    ws = _witnesses(2)
    with pytest.raises(PolicyError, match=match):
        parse_policy(text.format(w0=ws[0].verifier.encode(), w1=ws[1].verifier.encode()))


def test_verify_checkpoint_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log, ws = FakeLog(), _witnesses(2)
    log.grow(4)
    policy = tmp_path / "policy"
    policy.write_text(_policy(log, ws, 2) + "# comment\n")
    good, short = tmp_path / "good", tmp_path / "short"
    good.write_text(_cosigned(log, ws))
    short.write_text(_cosigned(log, ws[:1]))
    assert cli.main(["verify-checkpoint", str(good), "--policy", str(policy)]) == cli.EXIT_OK
    assert "WITNESSED" in capsys.readouterr().out
    assert cli.main(["verify-checkpoint", str(short), "--policy", str(policy)]) == cli.EXIT_QUORUM
    out = capsys.readouterr().out
    assert "REFUSED" in out and "does not meet the policy's quorum" in out
    impostor = FakeLog(log.origin)
    impostor.tree = log.tree
    forged = tmp_path / "forged"
    forged.write_text(_cosigned(impostor, ws))  # another log key: the policy's log did not sign it
    assert cli.main(["verify-checkpoint", str(forged), "--policy", str(policy)]) == cli.EXIT_FAILED
    assert cli.main(["verify-checkpoint", str(good)]) == cli.EXIT_USAGE  # neither key nor policy
    assert cli.main(["verify-checkpoint", str(short), "--key", log.vkey]) == cli.EXIT_OK  # no policy


def test_verify_proof_with_policy(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log, ws = FakeLog(), _witnesses(2)
    log.grow(9)
    policy = tmp_path / "policy"
    policy.write_text(_policy(log, ws, 2))
    leaf = log.tree.leaf(4)
    for name, cosigners, code in (("ok", ws, cli.EXIT_OK), ("short", ws[1:], cli.EXIT_QUORUM)):
        path = tmp_path / f"{name}.tlog-proof"
        path.write_text(tlogproof.format_proof(4, log.tree.inclusion_proof(4), _cosigned(log, cosigners)))
        args = ["verify-proof", str(path), "--policy", str(policy), "--leaf-hash", leaf.hex()]
        assert cli.main(args) == code
    wrong = hashlib.sha256(b"x").hexdigest()
    assert (
        cli.main(
            ["verify-proof", str(tmp_path / "ok.tlog-proof"), "--policy", str(policy), "--leaf-hash", wrong]
        )
        == 1
    )
    capsys.readouterr()
