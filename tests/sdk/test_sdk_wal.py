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
    real_fsync = wal_module._sync_data
    calls: list[int] = []

    def slow_fsync(fd: int) -> None:
        calls.append(fd)
        if len(calls) == 1:
            leader_in_fsync.set()
            assert release.wait(10)
        real_fsync(fd)

    followers = 7
    appended = threading.Semaphore(0)
    monkeypatch.setattr(wal_module, "_sync_data", slow_fsync)
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
    monkeypatch.setattr(wal_module, "_sync_data", real_fsync)
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
    # Durable steps were fsynced. How many rounds the threads shared depends on scheduling;
    # the group-commit tests above force the grouping and count exactly.
    assert wal.fsyncs > 0


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


# -- buffering, deferred commits, async group commit ----------------------------------------------


def _events(path: Any) -> list[str]:
    return [r["event"] for r in read_wal(path)] if path.exists() else []


def test_buffered_reversible_records_reach_the_file_before_the_next_durable_barrier(tmp_path: Any) -> None:
    # An hour-long flush interval: only the barrier can put them in the file.
    wal = sp.WAL(tmp_path / "a.wal", flush_interval=3600, write_through_intents=False)
    rev = sp.tool(lambda x: x, name="rev", semantics=sp.REVERSIBLE)
    comp = sp.tool(lambda x: x, name="comp", semantics=sp.COMPENSABLE)
    seen: list[list[str]] = []
    fx = sp.tool(lambda: seen.append(_events(tmp_path / "a.wal")), name="fx", semantics=sp.COMPENSABLE)
    with sp.saga(name="s", wal=wal):
        rev(1)
        assert wal.buffered == 3 and _events(tmp_path / "a.wal") == []  # queued, not written
        comp(2)
        fx()
    # Inside the COMPENSABLE effect: every earlier record, and fx's own intent, was in the file.
    assert seen == [
        ["SAGA_START", "STEP_INTENT", "STEP_COMMITTED", "STEP_INTENT", "STEP_COMMITTED", "STEP_INTENT"]
    ]
    wal.close()
    records = read_wal(tmp_path / "a.wal")
    assert verify_chain(records).intact and integrity.verify(records).intact
    assert [r["seq"] for r in records] == list(range(1, 9))


def test_by_default_every_intent_is_in_the_file_before_its_effect(tmp_path: Any) -> None:
    """A SIGKILL during a REVERSIBLE effect must not hide it: its intent is already written."""
    wal = sp.WAL(tmp_path / "a.wal", flush_interval=3600)
    seen: list[list[str]] = []
    rev = sp.tool(lambda: seen.append(_events(tmp_path / "a.wal")), name="rev", semantics=sp.REVERSIBLE)
    with sp.saga(name="s", wal=wal):
        rev()
    assert seen == [["SAGA_START", "STEP_INTENT"]]
    wal.close()


def test_buffered_records_reach_the_file_on_close_and_the_chain_verifies(tmp_path: Any) -> None:
    wal = sp.WAL(tmp_path / "a.wal", flush_interval=3600)
    rev = sp.tool(lambda x: x, name="rev", semantics=sp.REVERSIBLE)
    with sp.saga(name="s", wal=wal):
        rev({"nested": [1, 2.5, "é"]})
    # The terminal record is written through, carrying the queue with it.
    assert _events(tmp_path / "a.wal") == ["SAGA_START", "STEP_INTENT", "STEP_COMMITTED", "SAGA_COMPLETE"]
    wal.emit("NOTE", {"n": 1}, buffered=True)
    assert wal.buffered == 1 and len(read_wal(tmp_path / "a.wal")) == 4
    wal.close()
    records = read_wal(tmp_path / "a.wal")
    assert [r["event"] for r in records][-1] == "NOTE" and records[1]["kwargs"] == {
        "x": {"nested": [1, 2.5, "é"]}
    }
    assert verify_chain(records).intact and integrity.verify(records).intact


def test_buffered_records_are_written_at_interpreter_exit_without_close(tmp_path: Any) -> None:
    import subprocess
    import sys

    script = (
        "import sagaplane as sp, sys\n"
        "wal = sp.WAL(sys.argv[1], flush_interval=3600, write_through_intents=False)\n"
        "rev = sp.tool(lambda x: x, name='rev', semantics=sp.REVERSIBLE)\n"
        "s = sp.saga(name='s', wal=wal)\n"
        "s.__enter__()\n"
        "rev(1)\n"
        "assert wal.buffered == 3\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "a.wal")], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert _events(tmp_path / "a.wal") == ["SAGA_START", "STEP_INTENT", "STEP_COMMITTED"]


def test_buffered_records_are_written_within_the_flush_interval(tmp_path: Any) -> None:
    wal = sp.WAL(tmp_path / "a.wal", flush_interval=0.001)
    written = threading.Event()
    wal.subscribe(written.set)  # called once records are in the file
    wal.emit("NOTE", {"n": 1}, buffered=True)
    assert written.wait(10)
    assert _events(tmp_path / "a.wal") == ["NOTE"] and wal.buffered == 0
    wal.close()


def test_record_fields_are_captured_when_emitted(tmp_path: Any) -> None:
    wal = sp.WAL(tmp_path / "a.wal", flush_interval=3600)
    args = {"items": [1]}
    wal.emit("NOTE", {"args": args}, buffered=True)
    args["items"].append(2)  # mutated after the call: the record keeps what was passed
    wal.close()
    assert read_wal(tmp_path / "a.wal")[0]["args"] == {"items": [1]}


def test_failed_write_keeps_the_queue_and_the_chain(tmp_path: Any, monkeypatch: Any) -> None:
    wal = sp.WAL(tmp_path / "a.wal", flush_interval=3600)
    wal.emit("A", {}, buffered=True)
    real = wal_module.write_all

    def broken(fd: int, data: bytes) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(wal_module, "write_all", broken)
    with pytest.raises(sp.WALError):
        wal.emit("B", {})  # a write-through fails before its effect, loudly
    assert wal.buffered == 1
    monkeypatch.setattr(wal_module, "write_all", real)
    wal.emit("C", {})
    wal.close()
    records = read_wal(tmp_path / "a.wal")
    assert [r["event"] for r in records] == ["A", "C"] and [r["seq"] for r in records] == [1, 2]
    assert verify_chain(records).intact


def test_non_json_fields_fall_back_to_their_projection(tmp_path: Any) -> None:
    wal = sp.WAL(tmp_path / "a.wal")
    wal.append("E", {"nan": float("nan"), "obj": object, "t": (1, 2), "seq": 99, "_h": "forged"})
    wal.close()
    (record,) = read_wal(tmp_path / "a.wal")
    assert record["seq"] == 1 and record["nan"] == "nan" and record["t"] == [1, 2]
    assert record["obj"].startswith("<class") and record["_h"] != "forged"
    assert verify_chain([record]).intact and integrity.verify([record]).intact


def test_record_hash_fast_matches_the_canonical_form() -> None:
    import random

    from sagaplane.chain import record_hash, record_hash_fast

    rng = random.Random(5)
    for _ in range(500):
        ts = rng.random() * 10 ** rng.randint(0, 12)
        seq = rng.randint(1, 10**9)
        event = rng.choice(["STEP_INTENT", 'é"\\x', "SAGA_COMPLETE", "\u2028"])
        assert record_hash_fast("a" * 64, seq, ts, event, "d" * 64) == record_hash(
            "a" * 64, seq, ts, event, "d" * 64
        )


def test_compensable_step_needs_one_fsync_its_outcome_rides_the_next_barrier(
    tmp_path: Any, monkeypatch: Any
) -> None:
    wal = sp.WAL(tmp_path / "a.wal", durable_delay=3600)
    comp = sp.tool(lambda x: x, name="comp", semantics=sp.COMPENSABLE)
    durable_at_effect: list[list[str]] = []
    real_fsync = wal_module._sync_data

    def fsync(fd: int) -> None:
        real_fsync(fd)
        durable_at_effect.append(_events(tmp_path / "a.wal"))

    monkeypatch.setattr(wal_module, "_sync_data", fsync)
    with sp.saga(name="s", wal=wal):
        comp(1)
        comp(2)
        comp(3)
    # One fsync per step (its intent) plus one for the terminal record.
    assert wal.fsyncs == 4
    # Step 2's barrier covered step 1's commit; the terminal one covered step 3's.
    assert durable_at_effect[1][-2:] == ["STEP_COMMITTED", "STEP_INTENT"]
    assert durable_at_effect[-1][-2:] == ["STEP_COMMITTED", "SAGA_COMPLETE"]
    monkeypatch.setattr(wal_module, "_sync_data", real_fsync)
    wal.close()


def test_sync_soon_fsyncs_an_outcome_without_a_later_barrier(tmp_path: Any) -> None:
    wal = sp.WAL(tmp_path / "a.wal", durable_delay=0.001)
    mark = wal.emit("E", {}, buffered=True)
    done = threading.Event()
    wal.subscribe(done.set)
    wal.sync_soon(mark)
    assert done.wait(10)  # the flusher wrote it...
    with wal._cond:  # ...and fsyncs it: wait for the mark to become durable (no sleeping)
        assert wal._cond.wait_for(lambda: wal._durable >= mark, 10)
    assert wal.fsyncs == 1
    wal.close()


def test_steps_in_a_row_do_not_wake_the_flusher_each_and_every_outcome_still_becomes_durable(
    tmp_path: Any,
) -> None:
    """A durable step syncs its intent, then asks for its outcome with sync_soon. While steps keep
    coming, the flusher stays due by itself (every durable_delay) instead of being notified by each
    sync_soon; the last outcome, with no barrier after it, is still fsynced."""
    # A delay no loaded machine's step outlasts: the flusher never fsyncs between two steps here
    # (while it fsyncs, a sync_soon must notify it).
    wal = sp.WAL(tmp_path / "a.wal", durable_delay=0.5)
    notified = 0
    with wal._lock:
        wal._ensure_flusher_locked()
    real_notify = wal._flusher_cond.notify

    def counting_notify(n: int = 1) -> None:
        nonlocal notified
        notified += 1
        real_notify(n)

    wal._flusher_cond.notify = counting_notify  # type: ignore[method-assign]
    marks = []
    for _ in range(50):
        wal.emit("STEP_INTENT", {})
        wal.sync()  # the intent's barrier covers the previous outcome
        marks.append(wal.emit("STEP_COMMITTED", {}))
        wal.sync_soon(marks[-1])
    with wal._cond:  # the last outcome: fsynced by the flusher (waited for, no sleeping)
        assert wal._cond.wait_for(lambda: wal._durable >= marks[-1], 10)
    assert notified < 10, notified  # 50 before: one per sync_soon
    wal.close()


def test_async_sagas_share_fsyncs_on_the_flusher_thread(tmp_path: Any, monkeypatch: Any) -> None:
    """N concurrent async sagas: fewer fsyncs than durable waits, all on the flusher thread, and
    no intent or terminal record is acknowledged before an fsync covered it.

    The grouping is forced, not hoped for: each fsync round is held until every unfinished
    saga is blocked on the WAL, so on any machine, however loaded, the 32 intents share one
    round and the 32 terminal records the next."""
    wal = sp.WAL(tmp_path / "a.wal")
    path = tmp_path / "a.wal"
    tasks = 32
    finished = 0
    saga_ids: dict[int, str] = {}
    acked_early: list[str] = []
    gate_timeouts: list[int] = []
    fsynced_bytes = 0  # the file size the last completed fsync of this WAL covered
    fsync_threads: set[str] = set()
    # Shares the WAL's lock: the flusher holds it when it starts a round, tasks when they queue.
    quiescent = threading.Condition(wal._lock)

    def every_live_saga_is_waiting() -> bool:
        return len(wal._async_waiters) == tasks - finished

    real_round = wal._fsync_round_locked

    def gated_round() -> None:  # called by the flusher with the WAL's lock held
        if not quiescent.wait_for(every_live_saga_is_waiting, timeout=10):
            gate_timeouts.append(len(wal._async_waiters))  # asserted below, not in the flusher
        real_round()

    real_ensure = wal._ensure_flusher_locked

    def queued() -> None:  # sync_async calls it, lock held, right after queueing its waiter
        real_ensure()
        quiescent.notify_all()

    real_fsync = wal_module._sync_data

    def fsync(fd: int) -> None:
        nonlocal fsynced_bytes
        if fd != wal._fd:  # other tests' WALs may still be syncing in the background
            real_fsync(fd)
            return
        fsync_threads.add(threading.current_thread().name)
        size = wal_module.os.fstat(fd).st_size
        real_fsync(fd)
        fsynced_bytes = max(fsynced_bytes, size)

    monkeypatch.setattr(wal, "_fsync_round_locked", gated_round)
    monkeypatch.setattr(wal, "_ensure_flusher_locked", queued)
    monkeypatch.setattr(wal_module, "_sync_data", fsync)

    def end_of(event: str, saga_id: str) -> int:
        """Byte offset just past `saga_id`'s `event` record in the file."""
        offset = 0
        for line in path.read_bytes().splitlines(keepends=True):
            offset += len(line)
            record = json.loads(line)
            if record["event"] == event and record["saga_id"] == saga_id:
                return offset
        raise AssertionError(f"{event} of {saga_id} is not in the file")

    async def effect(i: int) -> int:
        # The effect runs only after its intent was acknowledged durable.
        if end_of("STEP_INTENT", saga_ids[i]) > fsynced_bytes:
            acked_early.append(f"intent of saga {i}")
        return i

    comp = sp.tool(effect, name="acomp", semantics=sp.COMPENSABLE)

    async def one(i: int) -> None:
        nonlocal finished
        async with sp.saga(name=f"a{i}", wal=wal) as saga:
            saga_ids[i] = saga.saga_id
            await comp(i)
        if end_of("SAGA_COMPLETE", saga_ids[i]) > fsynced_bytes:
            acked_early.append(f"terminal record of saga {i}")
        with quiescent:
            finished += 1
            quiescent.notify_all()

    async def main() -> None:
        await asyncio.gather(*(one(i) for i in range(tasks)))

    asyncio.run(main())
    monkeypatch.undo()
    assert not gate_timeouts, f"a round waited 10 s for the sagas to queue: {gate_timeouts}"
    assert not acked_early, acked_early
    # One wait per intent and per terminal record; one shared round for each group.
    assert wal.sync_waits == 2 * tasks
    assert wal.fsyncs == 2
    assert fsync_threads == {f"sagaplane-wal-{wal.stream_id}"}  # never on the event loop
    wal.close()
    records = read_wal(path)
    assert len(records) == tasks * 4 and verify_chain(records).intact and integrity.verify(records).intact


def test_async_waiter_fails_loudly_when_fsync_fails(tmp_path: Any, monkeypatch: Any) -> None:
    wal = sp.WAL(tmp_path / "a.wal")
    ran: list[int] = []

    async def effect(x: int) -> None:
        ran.append(x)

    comp = sp.tool(effect, name="comp", semantics=sp.COMPENSABLE)

    def broken(fd: int) -> None:
        raise OSError(5, "I/O error")

    monkeypatch.setattr(wal_module, "_sync_data", broken)

    async def main() -> None:
        async with sp.saga(name="s", wal=wal):
            await comp(1)

    with pytest.raises(sp.WALError):  # raised before the effect; the rollback cannot sync either
        asyncio.run(main())
    assert ran == []  # the effect never ran without its durable intent
