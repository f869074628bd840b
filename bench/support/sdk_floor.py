"""bench/sdk.py's floors and sample summaries: a bare write + fsync, a no-op call."""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import time
from pathlib import Path

perf = time.perf_counter


def pct(samples: list[float], p: float) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, max(0, round(p / 100 * (len(s) - 1))))]


def summary(samples_s: list[float]) -> dict[str, float]:
    us = [x * 1e6 for x in samples_s]
    return {
        "n": len(us),
        "p50_us": round(pct(us, 50), 2),
        "p99_us": round(pct(us, 99), 2),
        "mean_us": round(statistics.fmean(us), 2),
    }


# -- floors ------------------------------------------------------------------------------------------


def fsync_floor(folder: Path, n: int) -> dict[str, float]:
    line = (json.dumps({"seq": 1, "event": "STEP_INTENT", "pad": "x" * 300}) + "\n").encode()
    fd = os.open(folder / "floor.bin", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    samples = []
    try:
        for _ in range(n):
            t = perf()
            os.write(fd, line)
            os.fsync(fd)
            samples.append(perf() - t)
    finally:
        os.close(fd)
    return summary(samples)


def noop_baseline(n: int) -> dict[str, dict[str, float]]:
    def noop(x: int) -> int:
        return x

    async def anoop(x: int) -> int:
        return x

    sync = []
    for i in range(n):
        t = perf()
        noop(i)
        sync.append(perf() - t)

    async def run() -> list[float]:
        out = []
        for i in range(n):
            t = perf()
            await anoop(i)
            out.append(perf() - t)
        return out

    return {"sync": summary(sync), "async": summary(asyncio.run(run()))}
