"""WAL segments: roll-over by size and age, the chain across segments, removal of what the control
plane acknowledged and no open saga needs (with a chained attestation), the upgrade of a single-file
WAL, 24 simulated hours of a busy agent within the documented bound, SIGKILL of a real process
at every step of a roll-over and of a removal, and `sagaplane ship` / `verify-wal` on such a WAL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import sagaplane as sp
from agent_saga import integrity
from sagaplane.chain import GAP_EVENT, ChainWalk, attested_ranges, verify_chain
from sagaplane.cli import main as cli_main
from sagaplane.client import Response
from sagaplane.segments import LogReader, complete_end, disk_usage, load_manifest, segment_dir
from sagaplane.walcompact import as_runs
from sagaplane_testkit import API_KEY, FakeControlPlane


class Clock:
    """The WAL's clock, driven by the test (records' ts, segment age, lease lapse)."""

    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def records_of(path: Path) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    with LogReader(path) as reader:
        for line in iter(reader.readline, b""):
            if line.strip():
                out.append(json.loads(line))
    return out


def files_match_manifest(path: Path) -> None:
    manifest = load_manifest(path)
    if manifest is None:  # never rolled over (or the first roll-over never reached its manifest)
        assert not list(segment_dir(path).glob("*.wal"))
        return
    on_disk = sorted(p.name for p in segment_dir(path).glob("*.wal"))
    assert on_disk == [f"{s.base:020d}.wal" for s in manifest.segments]
    for seg in manifest.segments:
        assert (segment_dir(path) / f"{seg.base:020d}.wal").stat().st_size == seg.size
    assert not Path(f"{path}.next").exists()


def saga(wal: sp.WAL, i: int, *, steps: int = 2) -> None:
    with sp.saga(name=f"s{i}", wal=wal, retry_delay=0):
        for k in range(steps):
            sp.tool(lambda x: x, name="work", semantics=sp.REVERSIBLE)(k)


def test_roll_over_by_size_keeps_one_chain_across_segments(tmp_path: Path) -> None:
    path = tmp_path / "a.wal"
    with sp.WAL(path, segment_bytes=2048, fsync=False) as wal:
        for i in range(30):
            saga(wal, i)
        assert wal.rolls >= 5
    files_match_manifest(path)
    manifest = load_manifest(path)
    assert manifest is not None and manifest.live_base == sum(s.size for s in manifest.segments)
    records = records_of(path)
    assert [r["seq"] for r in records] == list(range(1, len(records) + 1))
    assert verify_chain(records).intact and integrity.verify(records).intact
    # Each sealed segment ends on a whole record and the next begins by linking to it.
    for seg in manifest.segments[1:]:
        with LogReader(path, seg.base) as reader:
            first = json.loads(reader.readline())
        assert first["_ph"] == next(r for r in records if r["seq"] == first["seq"] - 1)["_h"]
    assert cli_main(["verify-wal", str(path)]) == 0


def test_roll_over_by_age_on_the_wal_clock(tmp_path: Path) -> None:
    clock = Clock()
    with sp.WAL(tmp_path / "a.wal", segment_age_s=60, fsync=False, clock=clock) as wal:
        wal.append("NOTE", {"n": 1})
        clock.now += 59
        wal.append("NOTE", {"n": 2})
        assert wal.rolls == 0
        clock.now += 1
        wal.append("NOTE", {"n": 3})  # the segment is 60 s old: sealed after this record
        assert wal.rolls == 1
        wal.append("NOTE", {"n": 4})
    assert [r["n"] for r in records_of(tmp_path / "a.wal")] == [1, 2, 3, 4]


def test_configure_and_wal_take_segment_options(tmp_path: Path) -> None:
    runtime = sp.configure(tmp_path / "c.wal", ship=False, gate=False, segment_bytes=4096, segment_age_s=5.0)
    try:
        assert runtime.wal.segment_bytes == 4096 and runtime.wal.segment_age_s == 5.0
    finally:
        sp.shutdown()
    with pytest.raises(ValueError):
        sp.WAL(tmp_path / "bad.wal", segment_bytes=0)


def test_a_wal_never_acknowledged_is_never_compacted(tmp_path: Path) -> None:
    path = tmp_path / "a.wal"
    with sp.WAL(path, segment_bytes=1024, fsync=False) as wal:
        for i in range(20):
            saga(wal, i)
        sealed = len(load_manifest(path).segments)  # type: ignore[union-attr]
        assert sealed >= 4 and wal.compact() == 0
        assert len(load_manifest(path).segments) == sealed  # type: ignore[union-attr]
        # Acknowledged up to the middle of the third segment: the first two leave, no more.
        third = load_manifest(path).segments[2]  # type: ignore[union-attr]
        assert wal.acknowledge(third.base + 1) == 2
    files_match_manifest(path)
    records = records_of(path)
    gaps = [r for r in records if r["event"] == GAP_EVENT]
    assert len(gaps) == 1
    gap = gaps[0]
    assert gap["removed"] == records[0]["seq"] - 1 and gap["ranges"] == [[1, records[0]["seq"] - 1]]
    assert gap["reason"].startswith("compaction:") and len(gap["removed_digest"]) == 64
    report = verify_chain(records)
    assert report.intact and report.attested_gaps == 1
    assert integrity.verify(records).intact  # agent-saga reads the compacted WAL as its own
    assert cli_main(["verify-wal", str(path)]) == 0


def test_removed_digest_is_agent_sagas_digest_of_what_left(tmp_path: Path) -> None:
    path = tmp_path / "a.wal"
    with sp.WAL(path, segment_bytes=1024, fsync=False) as wal:
        for i in range(10):
            saga(wal, i)
        first = load_manifest(path).segments[0]  # type: ignore[union-attr]
        before = records_of(path)
        assert wal.acknowledge(first.end) == 1
    after = records_of(path)
    kept = {r["_h"] for r in after}
    left = [r for r in before if r["_h"] not in kept]
    gap = next(r for r in after if r["event"] == GAP_EVENT)
    assert gap["removed_digest"] == integrity.digest_of(left)
    assert gap["ranges"] == as_runs(r["seq"] for r in left) and gap["removed"] == len(left)


def test_an_open_saga_pins_its_segments_until_it_ends_or_its_lease_lapses(tmp_path: Path) -> None:
    clock = Clock()
    path = tmp_path / "a.wal"
    with sp.WAL(path, segment_bytes=1024, fsync=False, clock=clock) as wal:
        saga(wal, 0)
        wal.append("SAGA_START", {"saga_id": "long", "pid": 1, "lease_ttl": 600.0})
        for i in range(1, 15):
            saga(wal, i)
        everything = complete_end(path)
        pinned = len(load_manifest(path).segments)  # type: ignore[union-attr]
        removed = wal.acknowledge(everything)
        # Only segments wholly before the one "long" started in may leave.
        assert len(load_manifest(path).segments) == pinned - removed and pinned - removed >= 3  # type: ignore[union-attr]
        assert any(r.get("saga_id") == "long" for r in records_of(path))
        clock.now += 601  # its lease lapsed: the control plane's recovery owns it now
        assert wal.acknowledge(complete_end(path)) >= 3
        assert not any(r.get("saga_id") == "long" for r in records_of(path))
        # A saga that ends releases its pin at once.
        wal.append("SAGA_START", {"saga_id": "short", "pid": 1, "lease_ttl": 600.0})
        for i in range(15, 25):
            saga(wal, i)
        wal.acknowledge(complete_end(path))
        assert any(r.get("saga_id") == "short" for r in records_of(path))
        wal.append("SAGA_COMPLETE", {"saga_id": "short", "clean": True})
        for i in range(25, 35):
            saga(wal, i)
        wal.acknowledge(complete_end(path))
        assert not any(r.get("saga_id") == "short" for r in records_of(path))
    # The open sagas survive a reopen through the manifest and the live segment alone.
    with sp.WAL(path, segment_bytes=1024, fsync=False, clock=clock) as wal:
        wal.append("SAGA_START", {"saga_id": "again", "pid": 1, "lease_ttl": 600.0})
    with sp.WAL(path, segment_bytes=1024, fsync=False, clock=clock) as wal:
        assert set(wal._sagas.open) == {"again"}
    assert verify_chain(records_of(path)).intact


def test_a_single_file_wal_keeps_opening_and_rolls_over(tmp_path: Path) -> None:
    path = tmp_path / "old.wal"
    with sp.WAL(path, fsync=False) as wal:  # written before segments: one file
        for i in range(10):
            saga(wal, i)
    assert not segment_dir(path).exists()
    before = records_of(path)
    with sp.WAL(path, segment_bytes=1024, fsync=False) as wal:
        assert wal.seq == before[-1]["seq"]
        wal.append("NOTE", {"n": 1})  # the old file is past the size: sealed as segment 0
        assert wal.rolls == 1
        saga(wal, 99)
    manifest = load_manifest(path)
    assert manifest is not None and manifest.segments[0].base == 0
    records = records_of(path)
    assert records[: len(before)] == before and verify_chain(records).intact


# -- 24 simulated hours of a busy agent -----------------------------------------------------------


class AckingClient:
    """A control plane double for the shipper that verifies each batch from its stored head with the
    chain walk and keeps only the head (24 hours of records would not fit a test's patience twice)."""

    url = "http://acking.invalid"
    api_key = "sp_acking000000_secret"

    def __init__(self) -> None:
        self.head: str | None = None
        self.seq: int | None = None
        self.count = 0
        self.gaps = 0

    def stream(self, stream_id: str) -> Response:
        if self.head is None:
            return Response(404, {"error": "not_found"}, {})
        return Response(200, {"head": {"hash": self.head, "seq": self.seq}, "length": self.count}, {})

    def start_records_raw(self, stream_id: str, body: bytes, *, headers: Any = None) -> Any:
        records = json.loads(body)["records"]
        walk = ChainWalk(attested_ranges(records), head=self.head or "0" * 64, head_seq=self.seq, strict=True)
        for i, record in enumerate(records):
            assert not walk.step(i, record), walk.report.breaks
        self.head, self.seq = records[-1]["_h"], records[-1]["seq"]
        self.count += len(records)
        self.gaps += sum(r["event"] == GAP_EVENT for r in records)
        answer = Response(200, {"accepted": len(records), "duplicates": 0}, {})
        return type("Pending", (), {"response": lambda self: answer})()

    def close(self) -> None:
        pass


SEGMENT = 64 << 10
BOUND = 3 * SEGMENT + (16 << 10)  # docs/ARCHITECTURE.md §3: live + two sealed segments + metadata


def test_a_busy_agent_for_24_simulated_hours_stays_under_the_bound(tmp_path: Path) -> None:
    clock = Clock()
    path = tmp_path / "busy.wal"
    client = AckingClient()
    wal = sp.WAL(path, segment_bytes=SEGMENT, segment_age_s=600, fsync=False, clock=clock)
    shipper = sp.Shipper(path, stream_id=wal.stream_id, client=client)  # type: ignore[arg-type]
    shipper.on_acknowledged(wal.acknowledge)
    largest = 0
    written = 0
    try:
        for minute in range(24 * 60):
            for i in range(3):  # a saga every 20 simulated seconds, two steps each
                saga(wal, minute * 3 + i)
                clock.now += 20
            largest = max(largest, disk_usage(path))
            if minute % 5 == 4:  # the shipper catches up every 5 simulated minutes
                wal.flush()
                shipper.run_until_caught_up()
        written = wal.seq
    finally:
        wal.close()
    assert largest <= BOUND, (largest, BOUND)
    assert wal.rolls > 100 and wal.removed_segments > 100
    assert client.count == written and client.gaps > 0  # every record, attestations included, held
    records = records_of(path)
    assert records[-1]["seq"] == written and verify_chain(records).intact


# -- SIGKILL during roll-over and removal -----------------------------------------------------------

CHILD = textwrap.dedent(
    """
    import os, sys, threading
    import sagaplane as sp
    from sagaplane import segments, wallife
    from sagaplane.segments import complete_end

    path, stage, fd = sys.argv[1], sys.argv[2], int(sys.argv[3])
    wal = sp.WAL(path, segment_bytes=2048, fsync=True)

    def halt():
        os.write(fd, f"{wal._seq}\\n".encode())   # everything up to this seq is durable
        threading.Event().wait()                 # the parent SIGKILLs us here

    state = {"removing": False}
    real_remove, real_save, real_link = wallife.remove_segments, segments.save_manifest, os.link

    def remove(*a, **k):  # called once the attestation is chained and fsynced
        if stage == "remove:attested":
            halt()
        state["removing"] = True
        return real_remove(*a, **k)

    def save(*a, **k):
        out = real_save(*a, **k)
        if stage == ("remove:manifest" if state["removing"] else "roll:manifest"):
            halt()
        return out

    def link(*a, **k):
        real_link(*a, **k)
        if stage == "roll:linked":
            halt()

    wallife.remove_segments, segments.save_manifest, segments.os.link = remove, save, link
    for i in range(200):
        with sp.saga(name=f"s{i}", wal=wal):
            sp.tool(lambda x: x, name="work", semantics=sp.COMPENSABLE, compensate=lambda r: None)(i)
        if i == 60 and stage.startswith("remove"):
            wal.sync()
            wal.acknowledge(complete_end(path))
    os.write(fd, b"done\\n")
    """
)


@pytest.mark.parametrize("stage", ["roll:linked", "roll:manifest", "remove:attested", "remove:manifest"])
def test_sigkill_during_roll_over_or_removal_loses_nothing(tmp_path: Path, stage: str) -> None:
    path = tmp_path / "agent.wal"
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    read_fd, write_fd = os.pipe()
    proc = subprocess.Popen(
        [sys.executable, str(script), str(path), stage, str(write_fd)], pass_fds=(write_fd,)
    )
    os.close(write_fd)
    try:
        with os.fdopen(read_fd, "rb") as pipe:
            said = pipe.readline().decode().strip()
            os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(60)
    assert proc.returncode == -signal.SIGKILL and said.isdigit(), said
    durable = int(said)

    with sp.WAL(path, segment_bytes=2048) as wal:  # opens: the interrupted step is finished
        files_match_manifest(path)
        wal.append("AFTER_RESTART", {"n": 1})
    files_match_manifest(path)
    records = records_of(path)
    report = verify_chain(records)
    assert report.intact, report.first_break
    seqs = [r["seq"] for r in records]
    attested = attested_ranges(records)
    # Nothing up to what was durable is missing unless an attestation names it.
    assert all(s in seqs or s in attested for s in range(1, durable + 1))
    assert seqs == sorted(seqs) and seqs[-1] >= durable + 1
    if stage.startswith("remove"):
        gaps = [r for r in records if r["event"] == GAP_EVENT]
        assert len(gaps) == 1 and seqs[0] == gaps[0]["ranges"][-1][1] + 1
        assert not any(s in attested for s in seqs)  # what was attested left the disk
    assert cli_main(["verify-wal", str(path)]) == 0


def test_the_command_line_ships_and_verifies_a_segmented_compacted_wal(tmp_path: Path) -> None:
    path = tmp_path / "agent.wal"
    server = FakeControlPlane()
    env = {**os.environ, "SAGAPLANE_URL": server.url, "SAGAPLANE_API_KEY": API_KEY}
    run = [sys.executable, "-m", "sagaplane"]

    def ship() -> str:
        out = subprocess.run([*run, "ship", str(path)], env=env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return out.stdout

    try:
        with sp.WAL(path, segment_bytes=1024, fsync=False) as wal:
            for i in range(12):
                saga(wal, i)
        assert len(load_manifest(path).segments) >= 4  # type: ignore[union-attr]
        everything = records_of(path)
        assert f"shipped {len(everything)} record(s)" in ship()  # across the segments, in order
        stream = next(iter(server.streams))
        assert server.records(stream) == everything
        with sp.WAL(path, segment_bytes=1024, fsync=False) as wal:
            assert wal.acknowledge(load_manifest(path).segments[1].end) == 2  # type: ignore[union-attr]
            for i in range(12, 16):
                saga(wal, i)
        after = records_of(path)
        assert after[0]["seq"] > 1
        fresh = [r for r in after if r["seq"] > everything[-1]["seq"]]
        assert f"shipped {len(fresh)} record(s)" in ship()  # the cursor's logical offset still holds
        assert server.records(stream) == everything + fresh
        verified = subprocess.run([*run, "verify-wal", str(path)], capture_output=True, text=True, timeout=60)
        assert verified.returncode == 0 and "1 attested gap(s)" in verified.stdout, verified.stdout
    finally:
        server.close()
