"""SDK benchmark: what a saga step costs, what group commit buys, how fast the shipper ships.

Measured in one run, on one disk, against peers measured in the same run:
- a bare `os.fsync` floor (append a line + fsync) and a no-op call baseline;
- per-step latency p50/p99 for REVERSIBLE (no fsync) and COMPENSABLE (intent fsynced before the
  effect; the commit record rides the next barrier) steps, for the Sagaplane SDK (sync and async
  API) and agent-saga's `saga_scope` (async only);
- group-commit throughput with 1, 8 and 64 concurrent sagas of COMPENSABLE steps, both libraries;
- shipper throughput (the SDK's default Shipper) to a local control plane, uvicorn with 2 workers
  and a temp data folder, tenant and key made with the management commands: production-like on
  Postgres (+ Redis) when DATABASE_URL (REDIS_URL) is set -- in its own database
  `<name>_benchsdk`, created if missing -- and always embedded (SQLite); `shipper.<mode>` in the
  JSON. `make bench` finds a local Postgres and Redis like `make test` (infra/services.sh).

WAL life (issue 27, `bench/support/sdk_wal.py`): WAL open time against the history shipped (flat), and a
REVERSIBLE step with segments against the SDK before segments (p50 within 5%), in the same run.
The shipper's throughput is `bench/support/sdk_shipper.py`.

Issue 5 targets: fast path no slower than agent-saga's; durable step within 30% of the fsync
floor (a durable step has one fsync on its critical path -- its intent; the commit is made durable
by the next barrier or within the WAL's durable_delay -- so the floor is 1 x fsync; the 2 x ratio
of the earlier two-fsync design is still printed for comparison); shipper at least 5,000
records/s. Prints ratios; writes bench/results/sdk.json. `--quick` (CI) < 60 s.

    .venv/bin/python bench/sdk.py [--quick] [--skip-shipper]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "sdk"))
sys.path.insert(0, str(REPO))  # tests.support: the one wait-until and readiness probe
os.environ.pop("AGENT_SAGA_WAL_KEY", None)  # agent-saga's line encryption would skew its numbers

import sagaplane as sp  # noqa: E402
from agent_saga import compensator as as_compensator  # noqa: E402
from agent_saga import saga_scope  # noqa: E402
from agent_saga import tool as as_tool  # noqa: E402
from agent_saga.semantics import ActionSemantics, Compensation  # noqa: E402
from agent_saga.wal import FileWAL  # noqa: E402

from bench.support.sdk_floor import fsync_floor, noop_baseline, summary  # noqa: E402
from bench.support.sdk_shipper import shipper_modes, shipper_throughput  # noqa: E402
from bench.support.sdk_wal import wal_life  # noqa: E402

perf = time.perf_counter


# -- the tools -------------------------------------------------------------------------------------------


@sp.compensator("bench.undo")
def sp_undo(x: int, idempotency_key: str = "") -> None:
    pass


def _sp_fn(x: int) -> int:
    return x


async def _sp_afn(x: int) -> int:
    return x


def _undo(r: int) -> sp.Compensation:
    return sp.undo("bench.undo", x=r)


SP_REV = sp.tool(_sp_fn, name="rev", semantics=sp.REVERSIBLE, compensate=_undo)
SP_COMP = sp.tool(_sp_fn, name="comp", semantics=sp.COMPENSABLE, compensate=_undo)
SP_AREV = sp.tool(_sp_afn, name="arev", semantics=sp.REVERSIBLE, compensate=_undo)
SP_ACOMP = sp.tool(_sp_afn, name="acomp", semantics=sp.COMPENSABLE, compensate=_undo)


@as_compensator("bench.as_undo")
def as_undo(x: int, idempotency_key: str | None = None) -> None:
    pass


def _as_comp(r: int) -> Compensation:
    return Compensation(fn=as_undo, kwargs={"x": r}, handler="bench.as_undo", description="undo")


@as_tool(name="as_rev", semantics=ActionSemantics.REVERSIBLE, compensate=_as_comp)
async def AS_REV(x: int) -> int:  # noqa: N802
    return x


@as_tool(name="as_comp", semantics=ActionSemantics.COMPENSABLE, compensate=_as_comp)
async def AS_COMP(x: int) -> int:  # noqa: N802
    return x


# -- per-step latency --------------------------------------------------------------------------------------

STEPS_PER_SAGA = 10


def sp_steps(folder: Path, tool_fn: Callable[[int], Any], n: int) -> tuple[dict[str, float], int]:
    wal = sp.WAL(folder / f"sp-{id(tool_fn)}-{n}.wal")
    samples: list[float] = []
    try:
        while len(samples) < n:
            with sp.saga(name="bench", wal=wal):
                for i in range(STEPS_PER_SAGA):
                    t = perf()
                    tool_fn(i)
                    samples.append(perf() - t)
        return summary(samples), wal.fsyncs
    finally:
        wal.close()


def durable_interleaved(
    folder: Path, tool_fn: Callable[[int], Any], n: int, block: int = 50
) -> dict[str, Any]:
    """The durable step and its floor measured in turn, in blocks: `block` COMPENSABLE steps, then
    `block` write+fsync and `block` write+fdatasync of a line of the same size on files beside the
    WAL, and again, until n of each. On a shared disk the floor moves by 10x within a minute;
    measured a minute apart, the ratio measures the neighbours. Blocks, not single samples: an
    fsync commits the filesystem journal for every file, so a floor sample right after a step
    pays for the step's pending metadata and the other way round."""
    wal = sp.WAL(folder / f"sp-interleaved-{n}.wal")
    line = (json.dumps({"seq": 1, "event": "STEP_INTENT", "pad": "x" * 300}) + "\n").encode()
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT
    fds = [os.open(folder / f"floor-{name}.bin", flags, 0o644) for name in "ab"]
    datasync = getattr(os, "fdatasync", os.fsync)
    steps: list[float] = []
    fsyncs: list[float] = []
    datasyncs: list[float] = []

    def floor(fd: int, sync: Callable[[int], None], into: list[float]) -> None:
        for _ in range(block):
            t = perf()
            os.write(fd, line)
            sync(fd)
            into.append(perf() - t)

    block_ratios: list[float] = []  # each block's step median over the next fsync block's
    try:
        while len(steps) < n:
            with sp.saga(name="bench", wal=wal):
                for i in range(block):
                    t = perf()
                    tool_fn(i)
                    steps.append(perf() - t)
            floor(fds[0], os.fsync, fsyncs)
            floor(fds[1], datasync, datasyncs)
            block_ratios.append(statistics.median(steps[-block:]) / statistics.median(fsyncs[-block:]))
        wal_fsyncs = wal.fsyncs
    finally:
        wal.close()
        for fd in fds:
            os.close(fd)
    step, fsync_floor, datasync_floor = summary(steps), summary(fsyncs), summary(datasyncs)
    return {
        "block": block,
        "step": step,
        "fsync_floor": fsync_floor,
        "fdatasync_floor": datasync_floor,
        "wal_syncs_per_step": round(wal_fsyncs / len(steps), 2),
        "ratio_step_over_fsync_p50": ratio(step["p50_us"], fsync_floor["p50_us"]),
        "ratio_step_over_fsync_p99": ratio(step["p99_us"], fsync_floor["p99_us"]),
        "ratio_step_over_fdatasync_p50": ratio(step["p50_us"], datasync_floor["p50_us"]),
        # Robust to the disk's load moving during the run: the median of the per-block ratios.
        "ratio_step_over_fsync_p50_median_of_blocks": round(statistics.median(block_ratios), 3),
        "blocks": len(block_ratios),
    }


def durable_without_sync(folder: Path, tool_fn: Callable[[int], Any], n: int) -> dict[str, float]:
    """The durable step with the WAL's sync made a no-op (this run only, its own WAL): what a
    step costs besides its sync -- building, hashing and writing its intent and commit records,
    waking the WAL's syncer, the saga's bookkeeping. With the interleaved floor it splits a
    durable step's p50 into the sync and the rest (the target: the whole within 1.3x the sync)."""
    from sagaplane import wal as wal_module

    real = wal_module._sync_data
    wal_module._sync_data = lambda fd: None
    wal = sp.WAL(folder / f"sp-nosync-{n}.wal")
    samples: list[float] = []
    try:
        while len(samples) < n:
            with sp.saga(name="bench", wal=wal):
                for i in range(50):
                    t = perf()
                    tool_fn(i)
                    samples.append(perf() - t)
    finally:
        wal.close()
        wal_module._sync_data = real
    return summary(samples)


def sp_steps_async(folder: Path, tool_fn: Callable[[int], Any], n: int) -> dict[str, float]:
    async def run() -> list[float]:
        wal = sp.WAL(folder / f"spa-{n}-{id(tool_fn)}.wal")
        samples: list[float] = []
        try:
            while len(samples) < n:
                async with sp.saga(name="bench", wal=wal):
                    for i in range(STEPS_PER_SAGA):
                        t = perf()
                        await tool_fn(i)
                        samples.append(perf() - t)
        finally:
            wal.close()
        return samples

    return summary(asyncio.run(run()))


def as_steps(folder: Path, tool_fn: Callable[..., Any], n: int) -> dict[str, float]:
    async def run() -> list[float]:
        wal = FileWAL(str(folder / f"as-{n}-{id(tool_fn)}.wal"))
        await wal.start()
        samples: list[float] = []
        try:
            while len(samples) < n:
                async with saga_scope(name="bench", wal=wal):
                    for i in range(STEPS_PER_SAGA):
                        t = perf()
                        await tool_fn(x=i)
                        samples.append(perf() - t)
        finally:
            await wal.close()
        return samples

    return summary(asyncio.run(run()))


# -- group commit ------------------------------------------------------------------------------------------

GROUP_STEPS = 5  # COMPENSABLE steps per saga


def _group_result(concurrency: int, sagas: int, elapsed: float, fsyncs: int) -> dict[str, float]:
    steps = sagas * GROUP_STEPS
    return {
        "concurrency": concurrency,
        "sagas": sagas,
        "steps": steps,
        "seconds": round(elapsed, 4),
        "steps_per_s": round(steps / elapsed, 1),
        "fsyncs": fsyncs,
        "steps_per_fsync": round(steps / max(1, fsyncs), 2),
    }


def sp_group(folder: Path, concurrency: int, sagas_total: int) -> dict[str, float]:
    wal = sp.WAL(folder / f"sp-group-{concurrency}.wal")
    per_thread = max(1, sagas_total // concurrency)
    start = threading.Barrier(concurrency + 1)

    def worker() -> None:
        start.wait()
        for _ in range(per_thread):
            with sp.saga(name="g", wal=wal):
                for i in range(GROUP_STEPS):
                    SP_COMP(i)

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for th in threads:
        th.start()
    start.wait()
    t = perf()
    for th in threads:
        th.join()
    elapsed = perf() - t
    fsyncs = wal.fsyncs
    wal.close()
    return _group_result(concurrency, per_thread * concurrency, elapsed, fsyncs)


def sp_group_async(folder: Path, concurrency: int, sagas_total: int) -> dict[str, float]:
    per_task = max(1, sagas_total // concurrency)

    async def run() -> tuple[float, int]:
        wal = sp.WAL(folder / f"spa-group-{concurrency}.wal")
        loop = asyncio.get_running_loop()
        from concurrent.futures import ThreadPoolExecutor

        loop.set_default_executor(ThreadPoolExecutor(max_workers=max(4, concurrency)))

        async def one() -> None:
            for _ in range(per_task):
                async with sp.saga(name="g", wal=wal):
                    for i in range(GROUP_STEPS):
                        await SP_ACOMP(i)

        t = perf()
        await asyncio.gather(*(one() for _ in range(concurrency)))
        elapsed = perf() - t
        fsyncs = wal.fsyncs
        wal.close()
        return elapsed, fsyncs

    elapsed, fsyncs = asyncio.run(run())
    return _group_result(concurrency, per_task * concurrency, elapsed, fsyncs)


def as_group(folder: Path, concurrency: int, sagas_total: int) -> dict[str, float]:
    per_task = max(1, sagas_total // concurrency)

    async def run() -> tuple[float, int]:
        wal = FileWAL(str(folder / f"as-group-{concurrency}.wal"))
        await wal.start()

        async def one() -> None:
            for _ in range(per_task):
                async with saga_scope(name="g", wal=wal):
                    for i in range(GROUP_STEPS):
                        await AS_COMP(x=i)

        t = perf()
        await asyncio.gather(*(one() for _ in range(concurrency)))
        elapsed = perf() - t
        cycles = int(getattr(wal, "flush_cycles", 0))
        await wal.close()
        return elapsed, cycles

    elapsed, cycles = asyncio.run(run())
    return _group_result(concurrency, per_task * concurrency, elapsed, cycles)


# -- main ------------------------------------------------------------------------------------------


def ratio(a: float, b: float) -> float:
    return round(a / b, 3) if b else float("inf")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small counts (CI: under 60 s)")
    parser.add_argument("--skip-shipper", action="store_true")
    parser.add_argument("--dir", default=None, help="where WALs go (default: a temp folder under bench/)")
    parser.add_argument("--out", default=None, help="default: bench/results/sdk[-quick].json")
    args = parser.parse_args(argv)
    if args.out is None:  # quick runs (CI) never overwrite the full run's numbers
        args.out = str(REPO / "bench" / "results" / ("sdk-quick.json" if args.quick else "sdk.json"))
    q = args.quick
    n_fast, n_durable, n_floor = (2000, 200, 200) if q else (20000, 2000, 2000)
    group_sagas = {1: 20, 8: 80, 64: 256} if q else {1: 200, 8: 800, 64: 2560}
    ship_records = 10000 if q else 50000

    folder = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix=".bench-sdk-", dir=REPO / "bench"))
    folder.mkdir(parents=True, exist_ok=True)
    started = perf()
    out: dict[str, Any] = {
        "meta": {
            "quick": q,
            "database": "postgresql"
            if os.environ.get("DATABASE_URL", "").startswith("postgres")
            else "sqlite",
            "python": platform.python_version(),
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "sagaplane": sp.__version__,
            "agent_saga": _as_version(),
            "wal_dir": str(folder),
            "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            # The machine is shared: its load moves the fsync floor by 10x (durable_interleaved).
            "load_average_1m_before": round(os.getloadavg()[0], 2),
        },
    }
    try:
        print(f"== SDK benchmark ({'quick' if q else 'full'}); WALs in {folder}")
        out["fsync_floor"] = fsync_floor(folder, n_floor)
        out["noop"] = noop_baseline(n_fast)
        print(
            f"fsync floor (write+fsync): p50 {out['fsync_floor']['p50_us']} us, "
            f"p99 {out['fsync_floor']['p99_us']} us; no-op call p50 {out['noop']['sync']['p50_us']} us"
        )

        sp_rev, _ = sp_steps(folder, SP_REV, n_fast)
        sp_comp, comp_fsyncs = sp_steps(folder, SP_COMP, n_durable)
        per_step = {
            "sagaplane_sync": {"REVERSIBLE": sp_rev, "COMPENSABLE": sp_comp},
            "sagaplane_async": {
                "REVERSIBLE": sp_steps_async(folder, SP_AREV, n_fast),
                "COMPENSABLE": sp_steps_async(folder, SP_ACOMP, n_durable),
            },
            "agent_saga": {
                "REVERSIBLE": as_steps(folder, AS_REV, n_fast),
                "COMPENSABLE": as_steps(folder, AS_COMP, n_durable),
            },
        }
        for lib, rows in per_step.items():
            base = out["noop"]["async" if lib != "sagaplane_sync" else "sync"]["p50_us"]
            for sem, row in rows.items():
                row["overhead_p50_us"] = round(row["p50_us"] - base, 2)
                row["overhead_p99_us"] = round(row["p99_us"] - base, 2)
                print(
                    f"{lib:16} {sem:11} p50 {row['p50_us']:9.1f} us  p99 {row['p99_us']:9.1f} us  "
                    f"(overhead p50 {row['overhead_p50_us']:.1f} us over the no-op)"
                )
        per_step["sagaplane_sync"]["COMPENSABLE"]["fsyncs_per_step"] = round(comp_fsyncs / n_durable, 2)
        out["per_step"] = per_step
        out["durable_interleaved"] = inter = durable_interleaved(folder, SP_COMP, n_durable)
        print(
            f"durable step, interleaved with its floor: step p50 {inter['step']['p50_us']} us "
            f"p99 {inter['step']['p99_us']} us; write+fsync p50 {inter['fsync_floor']['p50_us']} us "
            f"p99 {inter['fsync_floor']['p99_us']} us; write+fdatasync p50 "
            f"{inter['fdatasync_floor']['p50_us']} us: {inter['ratio_step_over_fsync_p50']}x fsync at p50 "
            f"(median of per-block ratios {inter['ratio_step_over_fsync_p50_median_of_blocks']}x), "
            f"{inter['ratio_step_over_fsync_p99']}x at p99"
        )
        # Where a durable step's time goes: its sync (the interleaved fdatasync floor) and the rest.
        rest = durable_without_sync(folder, SP_COMP, n_durable)
        floor_us = inter["fdatasync_floor"]["p50_us"]
        inter["breakdown_p50_us"] = {
            "step": inter["step"]["p50_us"],
            "sync_floor_fdatasync": floor_us,
            "step_without_sync": rest["p50_us"],
            "step_without_sync_p99": rest["p99_us"],
            "unexplained": round(inter["step"]["p50_us"] - floor_us - rest["p50_us"], 2),
            "note": "step ~ sync + the rest (records built, hashed, written; the syncer woken); "
            "the rest alone is (1.3 - 1) x the floor at most for the target",
        }
        print(
            f"durable step p50 breakdown: sync (fdatasync floor) {floor_us} us + the rest "
            f"{rest['p50_us']} us (the step with a no-op sync) vs the step {inter['step']['p50_us']} us"
        )

        group: dict[str, list[dict[str, float]]] = {
            "sagaplane_threads": [],
            "sagaplane_async": [],
            "agent_saga": [],
        }
        for c, total in group_sagas.items():
            group["sagaplane_threads"].append(sp_group(folder, c, total))
            group["sagaplane_async"].append(sp_group_async(folder, c, total))
            group["agent_saga"].append(as_group(folder, c, total))
            row = [group[k][-1] for k in group]
            print(
                f"group commit, {c:2} concurrent sagas: "
                + "; ".join(
                    f"{k} {r['steps_per_s']:.0f} steps/s ({r['steps_per_fsync']} steps/fsync)"
                    for k, r in zip(group, row, strict=True)
                )
            )
        out["group_commit"] = group
        out["wal_life"] = wal_life(folder, q)  # issue 27: open time vs history, step cost vs before

        if not args.skip_shipper:
            out["shipper"] = {}
            for mode, env in shipper_modes():
                r = out["shipper"][mode] = shipper_throughput(folder, ship_records, mode, env)
                print(
                    f"shipper [{mode}]: {r['records']} records ({r['bytes'] / 1e6:.1f} MB) to a local "
                    f"control plane ({r['backend']}, uvicorn x{r['uvicorn_workers']}) in {r['seconds']} s "
                    f"= {r['records_per_s']:.0f} records/s over {r['http_connections']} HTTP "
                    f"connection(s); server head verified"
                )

        floor = out["fsync_floor"]["p50_us"]
        ps = out["per_step"]

        def p50(lib: str, sem: str) -> float:
            return float(ps[lib][sem]["p50_us"])

        ratios = {
            "fast_path_sagaplane_sync_vs_agent_saga_p50": ratio(
                p50("sagaplane_sync", "REVERSIBLE"), p50("agent_saga", "REVERSIBLE")
            ),
            "fast_path_sagaplane_async_vs_agent_saga_p50": ratio(
                p50("sagaplane_async", "REVERSIBLE"), p50("agent_saga", "REVERSIBLE")
            ),
            "durable_sagaplane_sync_vs_agent_saga_p50": ratio(
                p50("sagaplane_sync", "COMPENSABLE"), p50("agent_saga", "COMPENSABLE")
            ),
            "durable_sagaplane_sync_vs_fsync_floor_p50": ratio(p50("sagaplane_sync", "COMPENSABLE"), floor),
            # The same, each step sample beside a floor sample (see durable_interleaved).
            "durable_sagaplane_sync_vs_fsync_floor_p50_interleaved": out["durable_interleaved"][
                "ratio_step_over_fsync_p50_median_of_blocks"
            ],
            "durable_sagaplane_sync_vs_fsync_floor_p99_interleaved": out["durable_interleaved"][
                "ratio_step_over_fsync_p99"
            ],
            "durable_sagaplane_sync_vs_2x_fsync_floor_p50": ratio(
                p50("sagaplane_sync", "COMPENSABLE"), 2 * floor
            ),
            "durable_agent_saga_vs_2x_fsync_floor_p50": ratio(p50("agent_saga", "COMPENSABLE"), 2 * floor),
        }
        for i, c in enumerate(group_sagas):
            ratios[f"group_{c}_sagaplane_threads_vs_agent_saga"] = ratio(
                group["sagaplane_threads"][i]["steps_per_s"], group["agent_saga"][i]["steps_per_s"]
            )
            ratios[f"group_{c}_sagaplane_async_vs_agent_saga"] = ratio(
                group["sagaplane_async"][i]["steps_per_s"], group["agent_saga"][i]["steps_per_s"]
            )
        out["ratios"] = ratios
        targets = {
            "fast_path_no_slower_than_agent_saga": ratios["fast_path_sagaplane_sync_vs_agent_saga_p50"]
            <= 1.0,
            "durable_within_30pct_of_fsync_floor": ratios[
                "durable_sagaplane_sync_vs_fsync_floor_p50_interleaved"
            ]
            <= 1.3,
        }
        for mode, r in out.get("shipper", {}).items():
            targets[f"shipper_{mode}_at_least_5000_records_per_s"] = r["records_per_s"] >= 5000
        targets["wal_open_time_flat_in_history"] = out["wal_life"]["open_flat"]
        if "step" in out["wal_life"]:
            targets["step_with_segments_within_5pct"] = out["wal_life"]["step"]["ratio_p50"] <= 1.05
        out["targets"] = targets
        print("ratios (< 1 means Sagaplane is faster / closer to the floor):")
        for k, v in ratios.items():
            print(f"  {k:52} {v}")
        print("targets: " + ", ".join(f"{k}={'met' if v else 'MISSED'}" for k, v in targets.items()))
    finally:
        if not args.dir:
            shutil.rmtree(folder, ignore_errors=True)
    out["meta"]["seconds"] = round(perf() - started, 1)
    out["meta"]["load_average_1m_after"] = round(os.getloadavg()[0], 2)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(args.out + ".tmp")
    tmp.write_text(json.dumps(out, indent=2) + "\n")
    tmp.replace(args.out)
    print(f"wrote {args.out} in {out['meta']['seconds']} s")
    return 0


def _as_version() -> str:
    try:
        from importlib.metadata import version

        return version("agent-saga")
    except Exception:
        return "unknown"


if __name__ == "__main__":
    sys.exit(main())
