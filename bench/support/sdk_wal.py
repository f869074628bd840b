"""bench/sdk.py's WAL life (issue 27): open time against the history shipped, and step cost with
segments against the SDK before segments, both measured in the same run.

- Open time: a WAL is written with N records of sagas (default segment size), acknowledged as a
  shipper would after each roll-over (so removal runs), then opened and closed 5 times; the median
  open is reported per N. Beside it, the SDK before segments opening one file of the same records.
  Target: flat (the largest history opens within 1.5x of the one ten times smaller, + 5 ms).
- Step cost: a REVERSIBLE step (intent written through, no fsync), in alternating blocks of the SDK
  with segments and the SDK before them (extracted from git: the parent of the commit that added
  `sdk/sagaplane/segments.py`, importable as `sagaplane_base`). Target: p50 within 5%.
"""

from __future__ import annotations

import importlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import sagaplane as sp
from sagaplane.segments import complete_end, disk_usage

REPO = Path(__file__).resolve().parents[2]
perf = time.perf_counter


def base_sdk(folder: Path) -> Any | None:
    """The SDK as it was before segments, imported as `sagaplane_base` (None without git)."""
    try:
        added = subprocess.run(
            [
                "git",
                "-C",
                str(REPO),
                "log",
                "--diff-filter=A",
                "--format=%H",
                "--",
                "sdk/sagaplane/segments.py",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        ref = f"{added[-1]}^" if added else "HEAD"
        archive = subprocess.run(
            ["git", "-C", str(REPO), "archive", ref, "sdk/sagaplane"], capture_output=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    root = folder / "base-sdk"
    root.mkdir(exist_ok=True)
    subprocess.run(["tar", "-x", "-C", str(root)], input=archive, check=True)
    (root / "sdk" / "sagaplane").rename(root / "sagaplane_base")
    sys.path.insert(0, str(root))
    module = importlib.import_module("sagaplane_base")
    module.__bench_ref__ = ref  # type: ignore[attr-defined]
    return module


def _write_history(lib: Any, path: Path, n: int, *, ack: bool, **kw: Any) -> None:
    """n records of 4-record sagas, buffered (one write per 512 records); acknowledged after each
    roll-over when `ack` (what the shipper's verified cursor does)."""
    wal = lib.WAL(path, fsync=False, **kw)
    rolls = 0
    try:
        for i in range(n // 4):
            sid = f"bench-{i}"
            wal.emit("SAGA_START", {"saga_id": sid, "pid": 1, "lease_ttl": 30.0}, buffered=True)
            wal.emit(
                "STEP_INTENT",
                {"saga_id": sid, "step_id": "s1", "tool": "t", "kwargs": {"x": i}},
                buffered=True,
            )
            wal.emit("STEP_COMMITTED", {"saga_id": sid, "step_id": "s1", "result": i}, buffered=True)
            wal.emit("SAGA_COMPLETE", {"saga_id": sid, "clean": True}, buffered=True)
            if ack and wal.rolls != rolls:
                rolls = wal.rolls
                wal.flush()
                wal.acknowledge(complete_end(path))
    finally:
        wal.close()


def _median_open_ms(lib: Any, path: Path, repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        t = perf()
        wal = lib.WAL(path, fsync=False)
        times.append(perf() - t)
        wal.close()
    return round(statistics.median(times) * 1e3, 3)


# The single-file WAL of before segments is kept only up to here: at 10M records it is 3.7 GB.
BASE_UP_TO = 1_000_000


def open_time(folder: Path, sizes: list[int], base: Any | None) -> list[dict[str, Any]]:
    rows = []
    for n in sizes:
        seg = folder / f"open-{n}.wal"
        _write_history(sp, seg, n, ack=True)
        row: dict[str, Any] = {
            "records_shipped": n,
            "open_ms_segmented": _median_open_ms(sp, seg),
            "wal_dir_bytes": disk_usage(seg),
        }
        if base is not None and n <= BASE_UP_TO:
            one = folder / f"open-base-{n}.wal"
            _write_history(base, one, n, ack=False)
            row["open_ms_before_segments"] = _median_open_ms(base, one)
            row["single_file_bytes"] = one.stat().st_size
            one.unlink()
        rows.append(row)
        before = row.get("open_ms_before_segments")
        print(
            f"WAL open after {n:>9} records shipped: {row['open_ms_segmented']:8.3f} ms segmented "
            f"({row['wal_dir_bytes'] / 1e6:.1f} MB on disk)"
            + (f"; before segments {before:.3f} ms" if before is not None else "")
        )
    return rows


def step_cost(folder: Path, base: Any, n: int, block: int = 250) -> dict[str, Any]:
    """p50/p99 of a REVERSIBLE step, the two SDKs in alternating blocks of `block` steps."""
    libs = {"segmented": sp, "before_segments": base}
    tools = {
        name: lib.tool(lambda x: x, name=f"wal-bench-{name}", semantics=lib.REVERSIBLE)
        for name, lib in libs.items()
    }
    wals = {name: lib.WAL(folder / f"step-{name}.wal") for name, lib in libs.items()}
    samples: dict[str, list[float]] = {name: [] for name in libs}
    try:
        order = list(libs)
        while len(samples["segmented"]) < n:
            for name in order:
                lib, fn, wal = libs[name], tools[name], wals[name]
                with lib.saga(name="bench", wal=wal):
                    for i in range(block):
                        t = perf()
                        fn(i)
                        samples[name].append(perf() - t)
            order.reverse()
    finally:
        for wal in wals.values():
            wal.close()
    out: dict[str, Any] = {}
    for name, got in samples.items():
        got.sort()
        out[name] = {
            "p50_us": round(got[len(got) // 2] * 1e6, 2),
            "p99_us": round(got[int(len(got) * 0.99)] * 1e6, 2),
        }
    out["rolls"] = "default segment_bytes (4 MiB): the segmented WAL rolled over during the run"
    out["ratio_p50"] = round(out["segmented"]["p50_us"] / out["before_segments"]["p50_us"], 3)
    return out


def wal_life(folder: Path, quick: bool) -> dict[str, Any]:
    sizes = [1_000, 10_000, 100_000] if quick else [1_000, 10_000, 100_000, 1_000_000, 10_000_000]
    scratch = Path(tempfile.mkdtemp(prefix="wal-life-", dir=folder))
    try:
        base = base_sdk(scratch)
        out: dict[str, Any] = {"base_ref": getattr(base, "__bench_ref__", None)}
        out["open_time"] = rows = open_time(scratch, sizes, base)
        # Flat: past one segment of history (the first row), ten times the history opens no slower
        # than 1.5x (plus 5 ms of scheduling noise on a shared machine).
        prev, last = rows[-2]["open_ms_segmented"], rows[-1]["open_ms_segmented"]
        out["open_flat"] = last <= 1.5 * prev + 5.0
        if base is not None:
            out["step"] = step = step_cost(scratch, base, 4_000 if quick else 20_000)
            print(
                f"REVERSIBLE step p50: segmented {step['segmented']['p50_us']} us, before segments "
                f"{step['before_segments']['p50_us']} us: ratio {step['ratio_p50']} (target <= 1.05)"
            )
        return out
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
