"""Issue 9 defect 1: one chain walk, bounded by bytes.

The SDK's verifier (`verify_chain`, `sagaplane verify-wal`) and the control plane's ingest run the
same walk (`sagaplane.chain.ChainWalk`), so on any batch they agree: both accept it, or both name
the same first bad record for the same reason. Gap attestations are interval arithmetic: a ~1 KB
batch naming ranges of 10**12 seqs costs what its bytes cost, and a record with seq 10**9 is
named, not a reason to build a set of a billion ints.
"""

from __future__ import annotations

import copy
import json
import resource
import subprocess
import sys
import tracemalloc
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sagaplane.chain import (
    GAP_EVENT,
    GENESIS,
    MAX_GAP_RANGES,
    SeqRanges,
    redact_record,
    verify_chain,
)

from audit import services
from tenants.actors import named_actor
from tenants.models import Tenant
from tests.support.chains import T0, chain, restamp
from tests.support.scoping import in_tenant

VENV_BIN = Path(sys.executable).parent
Records = list[dict[str, Any]]
Verdict = tuple[str, int, str] | None  # (reason code, index of the first bad record, its text)


# A verifier that materialises the seqs a record names would take the whole (shared) machine here:
# cap this process' address space at what it uses now plus 2 GiB, so a regression fails these tests
# with MemoryError instead of waking the kernel's OOM killer.
MEMORY_HEADROOM = 2 << 30


def _address_space_in_use() -> int | None:
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return None
    line = next((line for line in status.splitlines() if line.startswith("VmSize:")), None)
    return None if line is None else int(line.split()[1]) * 1024


@pytest.fixture(autouse=True)
def _memory_guard() -> Iterator[None]:
    in_use = _address_space_in_use()
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if in_use is None:
        yield
        return
    cap = in_use + MEMORY_HEADROOM
    resource.setrlimit(resource.RLIMIT_AS, (cap if hard == resource.RLIM_INFINITY else min(cap, hard), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


# -- the two verdicts ---------------------------------------------------------------------------------


def sdk_verdict(records: Records) -> Verdict:
    first = verify_chain(copy.deepcopy(records), strict=True).first_break
    return None if first is None else (first.code, first.index, str(first))


def ingest_verdict(tenant: Tenant, records: Records) -> Verdict:
    try:
        in_tenant(
            services.ingest,
            tenant,
            f"diff-{uuid.uuid4().hex[:12]}",
            copy.deepcopy(records),
            actor=named_actor("test:differential"),
        )
    except services.IngestRefused as exc:
        return (exc.code, exc.index if exc.index is not None else -1, exc.detail)
    return None


# -- a corpus of good and broken chains ----------------------------------------------------------------


def bodies(n: int) -> Records:
    return [
        {"event": "STEP_INTENT", "saga_id": "s-1", "step_id": f"st-{i}", "tool": "pay", "kwargs": {"n": i}}
        for i in range(n)
    ]


def gap_record(ranges: Any) -> dict[str, Any]:
    return {
        "event": GAP_EVENT,
        "ranges": ranges,
        "removed": 0,
        "removed_digest": "ab" * 32,
        "reason": "compaction: test",
    }


def append(records: Records, body: dict[str, Any]) -> Records:
    """`body` chained at the tail (where agent-saga writes its attestations)."""
    last = records[-1]
    return records + chain([body], prev=last["_h"], seq=last["seq"] + 1)


def renumber(records: Records, start: int, first_seq: int) -> Records:
    """records[start:] numbered from `first_seq` and re-chained (self-consistent: only the seq
    rule can object)."""
    out = copy.deepcopy(records)
    for n, record in enumerate(out[start:]):
        record["seq"] = first_seq + n
    return restamp(out, start, out[start - 1]["_h"] if start else GENESIS)


def attested_deletion(records: Records, i: int, j: int) -> Records:
    """Compaction: records[i:j] removed, the removal attested at the tail (intact)."""
    removed = [r["seq"] for r in records[i:j]]
    kept = records[:i] + records[j:]
    return append(kept, gap_record([[removed[0], removed[-1]]]))


def huge_attested_jump(records: Records, i: int) -> Records:
    """The records from i on were numbered from 10**15 (a compacted giant log), and attested."""
    out = renumber(records, i, 10**15)
    return append(out, gap_record([[records[i]["seq"], 10**15 - 1]]))


MUTATIONS: dict[str, Callable[[Records, int], Records]] = {
    "edit_payload": lambda r, i: [*r[:i], {**r[i], "kwargs": {"n": -1}}, *r[i + 1 :]],
    "edit_ts": lambda r, i: [*r[:i], {**r[i], "ts": r[i]["ts"] + 1}, *r[i + 1 :]],
    "edit_event": lambda r, i: [*r[:i], {**r[i], "event": "SAGA_COMPLETE"}, *r[i + 1 :]],
    "edit_ph": lambda r, i: [*r[:i], {**r[i], "_ph": "cd" * 32}, *r[i + 1 :]],
    "genesis_ph": lambda r, i: [*r[:i], {**r[i], "_ph": GENESIS}, *r[i + 1 :]],
    "second_chain": lambda r, i: restamp(r, i, GENESIS),
    "delete": lambda r, i: r[:i] + r[i + 1 :],
    "delete_attested": lambda r, i: attested_deletion(r, i, min(i + 2, len(r) - 1)) if i < len(r) - 1 else r,
    "swap": lambda r, i: [*r[: i - 1], r[i], r[i - 1], *r[i + 1 :]] if i else r,
    "duplicate": lambda r, i: [*r[: i + 1], r[i], *r[i + 1 :]],
    "seq_jump": lambda r, i: renumber(r, i, r[i]["seq"] + 10**9),
    "seq_jump_max": lambda r, i: renumber(r, i, 2**61),
    "restart": lambda r, i: renumber(r, i, 1),
    "regress": lambda r, i: renumber(r, i, max(2, r[i]["seq"] - 2)),
    "huge_attested_jump": huge_attested_jump,
    "malformed_gap": lambda r, i: append(r, gap_record([[5, 2]])),
    "gap_not_ints": lambda r, i: append(r, gap_record([["1", 2]])),
    "gap_beyond_max": lambda r, i: append(r, gap_record([[1, 2**63]])),
    "gap_not_a_list": lambda r, i: append(r, gap_record("1-5")),
    "stub_with_payload": lambda r, i: [*r[:i], {**r[i], "_redacted": "x"}, *r[i + 1 :]],
    "redact": lambda r, i: [*r[:i], redact_record(r[i]), *r[i + 1 :]],
}


def corpus_chain(n: int) -> Records:
    return chain(bodies(n), ts=T0)


FIXED_CORPUS: list[tuple[str, Records]] = [("intact", corpus_chain(6))] + [
    (f"{name}@{i}", mutate(corpus_chain(6), i)) for name, mutate in MUTATIONS.items() for i in (0, 2, 5)
]


@pytest.mark.django_db
@pytest.mark.parametrize(("name", "records"), FIXED_CORPUS, ids=[name for name, _ in FIXED_CORPUS])
def test_sdk_verifier_and_ingest_agree_on_a_fixed_corpus(
    tenant_a: Tenant, name: str, records: Records
) -> None:
    sdk = sdk_verdict(records)
    assert ingest_verdict(tenant_a, records) == sdk
    # The corpus means something: honest logs are intact, tampering is caught.
    mutation, at = name.split("@")[0], int(name.split("@")[-1]) if "@" in name else 0
    if mutation in ("intact", "restart", "delete_attested", "huge_attested_jump", "redact"):
        assert sdk is None, sdk
    elif mutation not in ("swap", "genesis_ph", "second_chain", "delete") or 0 < at < 5:
        assert sdk is not None, name


@st.composite
def mutated_chains(draw: st.DrawFn) -> Records:
    records = corpus_chain(draw(st.integers(min_value=2, max_value=9)))
    for name in draw(st.lists(st.sampled_from(sorted(MUTATIONS)), max_size=3)):
        if len(records) < 2:
            break
        records = MUTATIONS[name](records, draw(st.integers(min_value=0, max_value=len(records) - 1)))
    return records


@pytest.mark.django_db
@settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(records=mutated_chains())
def test_sdk_verifier_and_ingest_agree_on_generated_chains(tenant_a: Tenant, records: Records) -> None:
    assert ingest_verdict(tenant_a, records) == sdk_verdict(records)


@given(
    runs=st.lists(
        st.tuples(st.integers(min_value=1, max_value=60), st.integers(min_value=0, max_value=8)), max_size=8
    ),
    lo=st.integers(min_value=0, max_value=70),
    width=st.integers(min_value=0, max_value=70),
)
def test_seq_ranges_answer_what_the_set_of_seqs_would(
    runs: list[tuple[int, int]], lo: int, width: int
) -> None:
    intervals = [(start, start + length) for start, length in runs]
    covered = {seq for start, end in intervals for seq in range(start, end + 1)}
    ranges = SeqRanges(intervals)
    missing = [seq for seq in range(lo, lo + width) if seq not in covered]
    assert ranges.missing(lo, lo + width) == (len(missing), missing[:5])
    assert len(ranges) == len(covered)
    assert all((seq in ranges) == (seq in covered) for seq in range(0, 80))


# -- memory and time bounded by bytes --------------------------------------------------------------------

RANGES_PER_BATCH = 24


def hostile_gap_batch(range_size: int) -> Records:
    """~1.5 KB: a record, a WAL_CHAIN_GAP naming 24 ranges of `range_size` seqs each, and a record
    whose seq jumps over all of them (an honest compaction, however large: accepted)."""
    first = corpus_chain(1)
    ranges = [[3 + k * range_size, 2 + (k + 1) * range_size] for k in range(RANGES_PER_BATCH)]
    records = append(first, gap_record(ranges))
    return records + chain(bodies(1), prev=records[-1]["_h"], seq=3 + RANGES_PER_BATCH * range_size)


def peak_bytes(work: Callable[[], Any]) -> int:
    tracemalloc.start()
    try:
        work()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


PEAK_BOUND = 4 << 20  # generous: the batch itself is ~1 KB; a set of its seqs would be gigabytes


@pytest.mark.django_db
@pytest.mark.parametrize("range_size", [50_000, 10**12])
def test_a_1kb_batch_of_huge_ranges_costs_what_its_bytes_cost(tenant_a: Tenant, range_size: int) -> None:
    batch = hostile_gap_batch(range_size)
    assert len(json.dumps({"records": batch}, separators=(",", ":"))) < 2_048
    in_tenant(
        services.ingest, tenant_a, "warm-up", corpus_chain(3), actor=named_actor("test")
    )  # imports and caches, untraced

    sdk_peak = peak_bytes(lambda: verify_chain(batch))
    results: list[Any] = []
    ingest_peak = peak_bytes(
        lambda: results.append(in_tenant(services.ingest, tenant_a, "huge", batch, actor=named_actor("test")))
    )

    assert verify_chain(batch).intact and verify_chain(batch).attested_gaps == 1
    assert results[0].accepted == 3 and results[0].head_seq == batch[-1]["seq"]
    assert sdk_peak < PEAK_BOUND and ingest_peak < PEAK_BOUND, (sdk_peak, ingest_peak)


@pytest.mark.django_db
def test_a_gap_record_with_too_many_ranges_is_named_by_both(tenant_a: Tenant) -> None:
    ranges = [[2 * k + 10, 2 * k + 10] for k in range(MAX_GAP_RANGES + 1)]
    records = append(corpus_chain(2), gap_record(ranges))
    sdk = sdk_verdict(records)
    assert sdk is not None and sdk[:2] == ("malformed_gap", 2) and f"at most {MAX_GAP_RANGES}" in sdk[2]
    assert ingest_verdict(tenant_a, records) == sdk


def test_a_gap_exactly_at_the_bound_still_attests() -> None:
    ranges = [[2 * k + 3, 2 * k + 3] for k in range(MAX_GAP_RANGES)]  # every other seq from 3
    records = corpus_chain(2)
    records = records + chain(bodies(1), prev=records[-1]["_h"], seq=2 * MAX_GAP_RANGES + 3)
    report = verify_chain(append(records, gap_record(ranges)))
    first = report.first_break
    # seqs 4, 6, 8, ... were never attested: named, with the count, without listing them all.
    assert first is not None and first.code == "seq_gap" and first.index == 2
    assert f"{MAX_GAP_RANGES} record(s) missing" in first.reason and "seq [4, 6, 8, 10, 12]" in first.reason


def _limit_memory() -> None:
    # A verifier that materialises a billion seqs dies here quickly instead of taking the machine.
    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))


def test_verify_wal_names_a_record_with_seq_1e9(tmp_path: Path) -> None:
    records = renumber(corpus_chain(4), 1, 10**9)
    wal = tmp_path / "agent.wal"
    wal.write_text("".join(json.dumps(r) + "\n" for r in records))
    done = subprocess.run(
        [str(VENV_BIN / "sagaplane"), "verify-wal", str(wal)],
        capture_output=True,
        text=True,
        timeout=120,  # a guard against hanging, not a timing assertion
        preexec_fn=_limit_memory,
    )
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert f"first bad record seq={10**9} index=1 (line 2)" in done.stdout
    assert (
        f"{10**9 - 2} record(s) missing with no {GAP_EVENT} attestation: seq [2, 3, 4, 5, 6]" in done.stdout
    )
