"""bench/recovery.py's sagas: the SDK's records of orphaned sagas, the handlers' ledger, and the
peer (agent-saga's own recovery daemon over a WAL file holding the same sagas)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

STEPS = 3
HANDLER_S = 0.020
LEASE_TTL = 2.0


def saga_records(n: int, prefix: str, *, ts: float) -> list[dict[str, Any]]:
    """The SDK's records of N sagas that each committed STEPS charges and then lost their agent."""
    from sagaplane.chain import GENESIS, stamp

    out: list[dict[str, Any]] = []
    head, seq = GENESIS, 0
    for i in range(n):
        saga_id = f"{prefix}-{i}"
        items: list[tuple[str, dict[str, Any]]] = [
            ("SAGA_START", {"saga_id": saga_id, "name": "checkout", "lease_ttl": LEASE_TTL})
        ]
        for s in range(1, STEPS + 1):
            step = {
                "saga_id": saga_id,
                "step_id": f"{saga_id}-s{s}",
                "tool": "shop.charge",
                "semantics": "COMPENSABLE",
            }
            compensation = {
                "fn": "refund",
                "handler": "bench.refund",
                "recoverable": True,
                "description": "refund",
                "idempotency_key": f"idem-{saga_id}-{s}",
                "kwargs": {"charge_id": f"ch-{saga_id}-{s}"},
            }
            items += [
                ("STEP_INTENT", {**step, "kwargs": {"amount": 10 * s}}),
                ("STEP_COMMITTED", {**step, "compensation": compensation}),
            ]
        for event, fields in items:
            seq += 1
            record = {"seq": seq, "ts": ts, "event": event, **fields}
            head = stamp(record, head)
            out.append(record)
    return out


def ledger_of(folder: Path) -> list[tuple[str, str, float]]:
    rows = []
    for path in folder.glob("*.log"):
        for line in path.read_text().splitlines():
            key, charge, started = line.split(" ")
            rows.append((key, charge, float(started)))
    return rows


PEER = textwrap.dedent(
    """
    import asyncio, json, os, sys, time
    from agent_saga import compensator
    from agent_saga.recovery import RecoveryDaemon

    calls = []

    @compensator("bench.refund")
    def refund(charge_id, idempotency_key=None):
        calls.append(idempotency_key)
        time.sleep(float(os.environ["BENCH_HANDLER_S"]))

    async def main():
        daemon = RecoveryDaemon(sys.argv[1])
        start = time.perf_counter()
        outcomes = await daemon.recover_all()
        took = time.perf_counter() - start
        print(json.dumps({"seconds": took, "sagas": len(outcomes), "calls": len(calls),
                          "distinct": len(set(calls)),
                          "resolutions": sorted({str(o.resolution) for o in outcomes})}))

    asyncio.run(main())
    """
)


def agent_saga_peer(n: int, folder: Path) -> dict[str, Any]:
    """agent-saga's own recovery daemon over a WAL file holding the same orphaned sagas (its lease
    long expired: the records are stamped an hour ago), in one process."""
    wal = folder / "peer.wal"
    wal.write_text("".join(json.dumps(r) + "\n" for r in saga_records(n, "peer", ts=time.time() - 3600)))
    script = folder / "peer.py"
    script.write_text(PEER)
    env = {**os.environ, "BENCH_HANDLER_S": str(HANDLER_S)}
    out = subprocess.run(
        [sys.executable, str(script), str(wal)],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    if out.returncode != 0:
        return {"error": (out.stdout + out.stderr)[-2000:]}
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result["jobs_per_s"] = round(result["calls"] / result["seconds"], 1) if result["seconds"] else None
    result["seconds"] = round(result["seconds"], 2)
    return result
