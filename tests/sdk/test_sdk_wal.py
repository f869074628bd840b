"""The local WAL: agent-saga compatibility, torn tails, group commit, stream ids, leases."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import pytest
import sagaplane as sp
from agent_saga import integrity
from sagaplane import wal as wal_module
from sagaplane.chain import GENESIS, redact_record, verify_chain
from sagaplane_testkit import read_wal


def write_some(wal: sp.WAL, sagas: int = 3) -> None:
    undo = sp.Compensation(fn=lambda: None)
    t = sp.tool(lambda x: x, name="t", semantics=sp.COMPENSABLE, compensate=lambda _r: undo)
    r = sp.tool(lambda x: x, name="r", semantics=sp.REVERSIBLE, compensate=lambda _r: undo)
    for i in range(sagas):
        try:
            with sp.saga(name=f"s{i}", wal=wal):
                t(i)
                r(i)
                if i % 2:
                    raise RuntimeError("fail")
        except sp.SagaAborted:
            pass


def test_sdk_wal_verifies_with_agent_saga(tmp_path: Any) -> None:
    with sp.WAL(tmp_path / "a.wal") as wal:
        write_some(wal)
    records = read_wal(tmp_path / "a.wal")
    theirs = integrity.verify(records)
    ours = verify_chain(records)
    assert theirs.intact and ours.intact
    assert theirs.head == ours.head == records[-1]["_h"]
    assert [r["seq"] for r in records] == list(range(1, len(records) + 1))


@pytest.mark.parametrize(
    "tamper",
    [
        ("kwargs", lambda r: r.update(kwargs={"x": 999})),
        ("ts", lambda r: r.update(ts=r["ts"] + 1)),
        ("event", lambda r: r.update(event="SAGA_COMPLETE")),
        ("_ph", lambda r: r.update(_ph=GENESIS)),
    ],
    ids=lambda t: t[0] if isinstance(t, tuple) else str(t),
)
def test_tampered_copy_fails_at_the_same_seq_in_both_verifiers(tmp_path: Any, tamper: Any) -> None:
    with sp.WAL(tmp_path / "a.wal") as wal:
        write_some(wal)
    records = read_wal(tmp_path / "a.wal")
    target = next(i for i, r in enumerate(records) if r["event"] == "STEP_INTENT" and i > 5)
    tamper[1](records[target])
    theirs = integrity.verify(records)
    ours = verify_chain(records)
    assert not theirs.intact and not ours.intact
    assert ours.first_break is not None
    assert (ours.first_break.seq, ours.first_break.index) == (theirs.breaks[0].seq, theirs.breaks[0].index)
    assert ours.first_break.seq == records[target]["seq"] and ours.first_break.index == target


def test_deleted_record_is_named(tmp_path: Any) -> None:
    with sp.WAL(tmp_path / "a.wal") as wal:
        write_some(wal)
    records = read_wal(tmp_path / "a.wal")
    del records[4]
    report = verify_chain(records)
    assert (
        report.first_break is not None
        and report.first_break.seq == 6
        and "missing" in report.first_break.reason
    )


def test_agent_saga_wal_with_restart_redaction_and_gap_verifies_here(tmp_path: Any) -> None:
    from agent_saga import saga_scope, tool
    from agent_saga.semantics import ActionSemantics, Compensation
    from agent_saga.wal import FileWAL

    @tool(semantics=ActionSemantics.COMPENSABLE, compensate=lambda r: Compensation(fn=lambda: None))
    def step(x: int) -> int:
        return x

    path = tmp_path / "as.wal"

    async def run(n: int) -> None:
        w = FileWAL(path)
        await w.start()
        for i in range(n):
            async with saga_scope(name=f"as{i}", wal=w):
                await step(x=i)
        await w.close()

    asyncio.run(run(2))
    asyncio.run(run(1))  # a restarted writer: seq restarts at 1, the chain continues
    records = read_wal(path)
    seqs = [r["seq"] for r in records]
    assert seqs.count(1) == 2
    report = verify_chain(records)
    assert report.intact and report.restarts == 1
    redacted, n = integrity.redact_where(records, lambda r: r.get("event") == "STEP_INTENT")
    assert n == 3
    assert verify_chain(redacted).intact and verify_chain(redacted).redacted == 3
    # Our redaction stub is the same shape as agent-saga's.
    assert redact_record(records[1]) == integrity.redact_record(records[1])
    # A payload-carrying record falsely marked redacted is not accepted as redacted.
    fake = [dict(r) for r in records]
    fake[1]["_redacted"] = "erasure-request"
    fake[1]["kwargs"] = {"x": 12345}
    assert not verify_chain(fake).intact


def test_attested_gap_is_accepted_and_unattested_gap_is_not(tmp_path: Any) -> None:
    with sp.WAL(tmp_path / "a.wal") as wal:
        write_some(wal, sagas=1)
        removed = read_wal(tmp_path / "a.wal")[1:3]
        wal.append(
            "WAL_CHAIN_GAP",
            {
                k: v
                for k, v in integrity.gap_attestation(
                    [r["seq"] for r in removed], integrity.digest_of(removed), "compaction: test"
                ).items()
                if k != "event"
            },
        )
    records = read_wal(tmp_path / "a.wal")
    kept = [records[0], *records[3:]]
    assert integrity.verify(kept).intact and verify_chain(kept).intact
    assert verify_chain(kept).attested_gaps == 1
    no_attestation = kept[:-1]
    assert not verify_chain(no_attestation).intact


def test_torn_last_line_is_truncated_and_the_chain_resumes(tmp_path: Any) -> None:
    path = tmp_path / "a.wal"
    with sp.WAL(path) as wal:
        write_some(wal, sagas=2)
        stream = wal.stream_id
    intact = read_wal(path)
    with open(path, "ab") as fh:
        fh.write(b'{"seq": 99, "event": "STEP_INTE')  # a crash in the middle of a write
    with sp.WAL(path) as wal:
        assert wal.stream_id == stream
        assert wal.seq == intact[-1]["seq"] and wal.head == intact[-1]["_h"]
        rec = wal.append("SAGA_START", {"saga_id": "after", "pid": 1, "lease_ttl": 1.0})
    assert rec["seq"] == intact[-1]["seq"] + 1 and rec["_ph"] == intact[-1]["_h"]
    records = read_wal(path)  # every line parses again
    assert records[:-1] == intact and records[-1] == rec
    assert verify_chain(records).intact and integrity.verify(records).intact
    assert (tmp_path / "a.wal.torn").read_bytes().startswith(b'{"seq": 99')


def test_garbage_complete_lines_at_the_tail_are_cut_too(tmp_path: Any) -> None:
    path = tmp_path / "a.wal"
    with sp.WAL(path) as wal:
        write_some(wal, sagas=1)
    good = read_wal(path)
    with open(path, "ab") as fh:
        fh.write(b"\x00\x00\x00\n\n{not json}\n")
    with sp.WAL(path) as wal:
        assert wal.head == good[-1]["_h"]
    assert read_wal(path) == good


def test_stream_id_is_stable_and_stored_next_to_the_wal(tmp_path: Any) -> None:
    path = tmp_path / "a.wal"
    with sp.WAL(path) as wal:
        first = wal.stream_id
    meta = json.loads((tmp_path / "a.wal.meta.json").read_text())
    assert meta["stream_id"] == first
    with sp.WAL(path) as wal:
        assert wal.stream_id == first
    with pytest.raises(ValueError):
        sp.WAL(path, stream_id="someone-else")


def test_second_writer_is_refused(tmp_path: Any) -> None:
    with sp.WAL(tmp_path / "a.wal"), pytest.raises(sp.WALLocked):
        sp.WAL(tmp_path / "a.wal")


def test_group_commit_one_fsync_covers_all_waiting_writers(tmp_path: Any, monkeypatch: Any) -> None:
    wal = sp.WAL(tmp_path / "a.wal")
    leader_in_fsync = threading.Event()
    release = threading.Event()
    real_fsync = wal_module.os.fsync
    calls: list[int] = []

    def slow_fsync(fd: int) -> None:
        calls.append(fd)
        if len(calls) == 1:
            leader_in_fsync.set()
            assert release.wait(10)
        real_fsync(fd)

    followers = 7
    appended = threading.Semaphore(0)
    monkeypatch.setattr(wal_module.os, "fsync", slow_fsync)
    leader = threading.Thread(target=wal.append, args=("E", {"who": "leader"}), kwargs={"durable": True})
    leader.start()
    assert leader_in_fsync.wait(10)
    wal.subscribe(appended.release)
    threads = [
        threading.Thread(target=wal.append, args=("E", {"who": i}), kwargs={"durable": True})
        for i in range(followers)
    ]
    for t in threads:
        t.start()
    for _ in range(followers):
        assert appended.acquire(timeout=10)  # every follower has written its record
    release.set()
    for t in [leader, *threads]:
        t.join(10)
    # One fsync for the leader, exactly one more for all seven followers.
    assert len(calls) == 2
    assert wal.fsyncs == 2 and wal.sync_waits == 8
    monkeypatch.setattr(wal_module.os, "fsync", real_fsync)
    wal.close()
    records = read_wal(tmp_path / "a.wal")
    assert len(records) == 8 and verify_chain(records).intact


def test_many_threads_many_sagas_one_valid_chain(tmp_path: Any) -> None:
    wal = sp.WAL(tmp_path / "a.wal")
    undo = sp.Compensation(fn=lambda: None)
    t = sp.tool(lambda x: x, name="t", semantics=sp.COMPENSABLE, compensate=lambda _r: undo)
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        try:
            for i in range(10):
                with sp.saga(name=f"w{n}-{i}", wal=wal):
                    t(i)
                    t(i + 1)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(16)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    wal.close()
    assert not errors
    records = read_wal(tmp_path / "a.wal")
    assert len(records) == 16 * 10 * 6
    assert verify_chain(records).intact and integrity.verify(records).intact
    by_saga: dict[str, list[str]] = {}
    for r in records:
        by_saga.setdefault(r["saga_id"], []).append(r["event"])
    assert len(by_saga) == 160
    assert all(
        ev
        == ["SAGA_START", "STEP_INTENT", "STEP_COMMITTED", "STEP_INTENT", "STEP_COMMITTED", "SAGA_COMPLETE"]
        for ev in by_saga.values()
    )
    # Durable steps fsynced, and concurrency let some fsyncs be shared.
    assert 0 < wal.fsyncs <= wal.sync_waits


def test_lease_heartbeats_are_written_while_a_saga_runs(tmp_path: Any) -> None:
    wal = sp.WAL(tmp_path / "a.wal")
    leased = threading.Event()

    def watch() -> None:
        if any(r["event"] == "SAGA_LEASE" for r in read_wal(tmp_path / "a.wal")):
            leased.set()

    wal.subscribe(watch)
    with sp.saga(name="long", wal=wal, lease_ttl=0.06) as s:
        assert leased.wait(10)
    wal.close()
    records = read_wal(tmp_path / "a.wal")
    leases = [r for r in records if r["event"] == "SAGA_LEASE"]
    assert leases and all(r["saga_id"] == s.saga_id for r in leases)
    start = records[0]
    assert start["event"] == "SAGA_START" and start["lease_ttl"] == 0.06
