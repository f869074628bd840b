"""C2SP tlog-policy files (https://c2sp.org/tlog-policy): which logs, which witnesses, and the
quorum of witnesses whose cosignatures make a checkpoint valid.

    log <vkey> [<url>]
    witness <name> <vkey> [<url>]
    group <name> all|any|<k> <name>...
    quorum <name>|none

A checkpoint satisfies the policy when it is signed by one of the logs and the quorum of
witnesses cosigned it (`Policy.check`); cosignatures are C2SP tlog-cosignature v1 (Ed25519 0x04
or ML-DSA-44 0x06, `sagaplane.cosignature`). Standard library plus `cryptography` to verify.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field

from . import cosignature, note

__all__ = ["Policy", "PolicyError", "QuorumError", "WitnessedCheckpoint", "load_policy", "parse_policy"]


class PolicyError(ValueError):
    """The policy file is malformed."""


class QuorumError(ValueError):
    """The checkpoint is validly signed by the log but not cosigned by the policy's quorum."""


@dataclass(frozen=True)
class _Group:
    threshold: int
    members: tuple[str, ...]


@dataclass(frozen=True)
class WitnessedCheckpoint:
    checkpoint: note.Checkpoint
    witnesses: tuple[str, ...]  # the policy's names of the witnesses whose cosignature verified

    def summary(self) -> str:
        names = ", ".join(self.witnesses) or "none needed"
        return f"{self.checkpoint.origin} at size {self.checkpoint.size}, cosigned by {names}"


@dataclass
class Policy:
    logs: list[note.Verifier] = field(default_factory=list)
    witnesses: dict[str, cosignature.CosignatureVerifier] = field(default_factory=dict)
    groups: dict[str, _Group] = field(default_factory=dict)
    quorum: str = ""

    def _witnessed(self, name: str, cosigned: set[str]) -> bool:
        if name == "none":
            return True
        if name in self.witnesses:
            return name in cosigned
        group = self.groups[name]
        return sum(self._witnessed(member, cosigned) for member in group.members) >= group.threshold

    def check(self, signed_note: str, origin: str | None = None) -> WitnessedCheckpoint:
        """The checkpoint, when `signed_note` is signed by one of the policy's logs (NoteError if
        not) and cosigned by its quorum (QuorumError naming who cosigned if not)."""
        if not self.logs:
            raise PolicyError("the policy names no log to verify a checkpoint against")
        checkpoint = note.open_checkpoint(signed_note, self.logs, origin)
        if not any(log.name == checkpoint.origin for log in self.logs):
            raise note.MalformedCheckpointError(f"no log of the policy has origin {checkpoint.origin!r}")
        parsed = note.parse_note(signed_note)
        valid = cosignature.valid_cosignatures(parsed.text, parsed.signatures, self.witnesses.values())
        cosigned = {name for name, key in self.witnesses.items() if key in valid}
        if not self._witnessed(self.quorum, cosigned):
            have = ", ".join(sorted(cosigned)) or "no witness of the policy"
            raise QuorumError(
                f"the checkpoint of {checkpoint.origin} at size {checkpoint.size} is cosigned by {have}, "
                f"which does not meet the policy's quorum {self.quorum!r}"
            )
        return WitnessedCheckpoint(checkpoint, tuple(sorted(cosigned)))


def _check_chars(text: str) -> None:
    for ch in text:
        if ch not in "\t\n" and (ord(ch) < 0x20 or ord(ch) == 0x7F):
            raise PolicyError(f"control character U+{ord(ch):04X} in the policy file")


def _threshold(word: str, members: int, number: int) -> int:
    if word == "all":
        return members
    if word == "any":
        return 1
    if not word.isascii() or not word.isdigit() or not 1 <= int(word) <= members:
        raise PolicyError(f"line {number}: a group's threshold is all, any or 1..{members}")
    return int(word)


def _define(policy: Policy, name: str, number: int) -> None:
    if name == "none" or name in policy.witnesses or name in policy.groups:
        raise PolicyError(f"line {number}: the name {name!r} is already defined")


def _parse_line(policy: Policy, words: list[str], number: int, public_keys: set[bytes]) -> None:
    keyword, args = words[0], words[1:]
    try:
        if keyword == "log" and 1 <= len(args) <= 2:
            log = note.parse_verifier_key(args[0])
            if log.public_key in public_keys:
                raise PolicyError(f"line {number}: a duplicate key")
            public_keys.add(log.public_key)
            policy.logs.append(log)
        elif keyword == "witness" and 2 <= len(args) <= 3:
            _define(policy, args[0], number)
            key = cosignature.parse_cosigner_vkey(args[1])
            if key.public_key in public_keys:
                raise PolicyError(f"line {number}: a duplicate key")
            public_keys.add(key.public_key)
            policy.witnesses[args[0]] = key
        elif keyword == "group" and len(args) >= 3:
            _define(policy, args[0], number)
            members = tuple(args[2:])
            if len(set(members)) != len(members):
                raise PolicyError(f"line {number}: a group lists a member twice")
            for member in members:
                if member not in policy.witnesses and member not in policy.groups:
                    raise PolicyError(f"line {number}: {member!r} is not a witness or group defined above")
            policy.groups[args[0]] = _Group(_threshold(args[1], len(members), number), members)
        elif keyword == "quorum" and len(args) == 1:
            if policy.quorum:
                raise PolicyError(f"line {number}: a second quorum line")
            name = args[0]
            if name != "none" and name not in policy.witnesses and name not in policy.groups:
                raise PolicyError(f"line {number}: the quorum {name!r} is not defined above")
            policy.quorum = name
        else:
            raise PolicyError(f"line {number}: not a log, witness, group or quorum line")
    except note.NoteError as exc:
        raise PolicyError(f"line {number}: {exc}") from None


def parse_policy(text: str | bytes) -> Policy:
    if isinstance(text, bytes):
        text = text.decode("utf-8", "surrogateescape")
    _check_chars(text)
    policy = Policy()
    public_keys: set[bytes] = set()
    for number, line in enumerate(text.split("\n"), start=1):
        words = line.replace("\t", " ").split(" ")
        words = [w for w in words if w]
        if not words or words[0].startswith("#"):
            continue
        _parse_line(policy, words, number, public_keys)
    if not policy.quorum:
        raise PolicyError("the policy has no quorum line")
    return policy


def load_policy(path: str | os.PathLike[str]) -> Policy:
    try:
        with open(path, "rb") as fh:
            return parse_policy(fh.read())
    except OSError as exc:
        raise PolicyError(f"cannot read the policy {path}: {exc}") from None


def format_policy(
    logs: Iterable[str], witnesses: Iterable[tuple[str, str, str]], quorum: int, group: str = "witnesses"
) -> str:
    """A policy file: the log vkeys, (name, vkey, url) witnesses, at least `quorum` of them
    (0: `quorum none`)."""
    lines = [f"log {vkey}" for vkey in logs]
    names = []
    for name, vkey, url in witnesses:
        lines.append(f"witness {name} {vkey} {url}".rstrip())
        names.append(name)
    if quorum and names:
        lines.append(f"group {group} {quorum} {' '.join(names)}")
        lines.append(f"quorum {group}")
    else:
        lines.append("quorum none")
    return "\n".join(lines) + "\n"
