"""Real `sagaplane witness serve` processes for tests and benchmarks, and a log to feed them."""

from __future__ import annotations

import http.client
import os
import select
import signal
import subprocess
import sys
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

from sagaplane import merkle, note

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class RunningWitness:
    process: subprocess.Popen[str]
    directory: Path
    url: str  # the submission prefix, e.g. http://127.0.0.1:41234
    vkeys: list[str]  # Ed25519 (0x04) first, then ML-DSA-44 (0x06) when available

    @property
    def vkey(self) -> str:
        return self.vkeys[0]

    def post(self, body: bytes | str) -> tuple[int, str, str]:
        """POST /add-checkpoint: (status, content type, body)."""
        parts = urllib.parse.urlsplit(self.url)
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
        try:
            raw = body.encode() if isinstance(body, str) else body
            conn.request("POST", "/add-checkpoint", body=raw)
            response = conn.getresponse()
            return response.status, response.getheader("Content-Type", ""), response.read().decode()
        finally:
            conn.close()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=30)


def _command(*args: str) -> list[str]:
    return [sys.executable, "-m", "sagaplane", "witness", *args]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT / "sdk")}


def init_witness(directory: Path, name: str) -> list[str]:
    out = subprocess.run(
        _command("init", "--name", name, "--dir", str(directory)),
        capture_output=True,
        text=True,
        env=_env(),
        timeout=120,
        check=True,
    )
    return out.stdout.split()


def start_witness(
    directory: Path, name: str, logs: list[tuple[str, str]], *, deadline_s: float = 120
) -> RunningWitness:
    """Init (unless its key exists) and serve a witness on a free loopback port; returns once it
    listens (its first line names the port)."""
    vkeys = init_witness(directory, name) if not (directory / "witness.key").exists() else []
    args = ["serve", "--dir", str(directory), "--listen", "127.0.0.1:0"]
    for origin, vkey in logs:
        args += ["--log", f"{origin} {vkey}"]
    stderr = open(directory / "serve.log", "a")  # noqa: SIM115 (the process owns it)
    process = subprocess.Popen(_command(*args), stdout=subprocess.PIPE, stderr=stderr, text=True, env=_env())
    stderr.close()
    assert process.stdout is not None
    end = time.monotonic() + deadline_s
    line = ""
    while time.monotonic() < end and process.poll() is None:
        ready, _, _ = select.select([process.stdout], [], [], 1.0)
        if ready:
            line = process.stdout.readline()
            break
    if "listening on" not in line:
        process.kill()
        raise RuntimeError(f"witness did not start: {line!r} {(directory / 'serve.log').read_text()[-2000:]}")
    address = line.split("listening on ", 1)[1].split()[0]
    if not vkeys:
        from sagaplane.witness import load_cosigners

        vkeys = [c.verifier.encode() for c in load_cosigners(directory)]
    return RunningWitness(process, directory, f"http://{address}", vkeys)


@dataclass
class FakeLog:
    """A log that signs checkpoints of an in-memory tree (and can fork it)."""

    origin: str = "sagaplane.test/log"
    signer: note.Signer = field(init=False)
    tree: merkle.MemoryTree = field(default_factory=merkle.MemoryTree)

    def __post_init__(self) -> None:
        self.signer = note.generate_signer(self.origin)

    @property
    def vkey(self) -> str:
        return self.signer.verifier_key

    def grow(self, count: int, tag: str = "") -> None:
        for _ in range(count):
            self.tree.append_data(f"{tag}leaf {self.tree.size}".encode())

    def checkpoint(self, size: int | None = None, root: bytes | None = None) -> str:
        size = self.tree.size if size is None else size
        root = self.tree.root(size) if root is None else root
        return note.sign_checkpoint(note.Checkpoint(self.origin, size, root), self.signer)

    def request(self, old: int, checkpoint: str | None = None, proof: list[bytes] | None = None) -> str:
        import base64

        if proof is None:
            new = note.parse_checkpoint(note.parse_note(checkpoint or self.checkpoint()).text).size
            proof = self.tree.consistency_proof(old, new) if 0 < old < new else []
        lines = "".join(base64.b64encode(h).decode() + "\n" for h in proof)
        return f"old {old}\n{lines}\n{checkpoint or self.checkpoint()}"
