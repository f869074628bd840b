"""What the MCP gateway adds to a tool call: a real MCP client calling the example shop server
(sdk/examples/mcp_shop_server.py, over stdio) directly -- the peer -- and through `sagaplane
mcp-gateway` (over stdio, the shop its upstream), in the same run, their calls alternating, for a PREVIEW call
(search_products: no fsync) and a COMPENSABLE call (charge_card: its intent fsynced before the
call is forwarded); then calls/s through one gateway with concurrent calls in flight. The gateway
runs without a control plane (no shipping, no gate round trip: the gate's own cost is
bench/gate.py's), so the figure is the gateway's own: the extra hop, the policy, the WAL. One
fdatasync of a small append on the same disk is measured beside it (COMPENSABLE's target:
direct + one fsync).

    .venv/bin/python bench/integrations.py [--quick]

Writes bench/results/integrations.json (`--quick`: integrations-quick.json), with the machine's
load before and after (the machine is shared: read the figures with it).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
from mcp.client.session import ClientSession
from sagaplane.integrations.mcp_upstream import UpstreamSpec, bounded_stdio

ROOT = Path(__file__).resolve().parents[1]
SHOP = ROOT / "sdk" / "examples" / "mcp_shop_server.py"
POLICY = ROOT / "sdk" / "examples" / "mcp_shop_policy.toml"
SAGAPLANE = Path(sys.executable).parent / "sagaplane"
CALLS = {
    "PREVIEW": ("search_products", {"query": "tea"}),
    "COMPENSABLE": ("charge_card", {"customer": "a", "amount_cents": 1}),
}


def _pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _summary(samples: list[float]) -> dict[str, float]:
    ms = [s * 1000 for s in samples]
    return {
        "n": len(ms),
        "p50_ms": round(statistics.median(ms), 3),
        "p99_ms": round(_pct(ms, 0.99), 3),
        "mean_ms": round(statistics.fmean(ms), 3),
    }


async def _latencies(
    gateway: UpstreamSpec, direct: UpstreamSpec, n: int
) -> dict[str, dict[str, list[float]]]:
    """Both sessions open at once, their calls alternating (the machine's load hits both alike)."""
    out: dict[str, dict[str, list[float]]] = {"gateway": {}, "direct": {}}
    async with (
        bounded_stdio(gateway) as (g_read, g_write),
        ClientSession(g_read, g_write) as through,
        bounded_stdio(direct) as (d_read, d_write),
        ClientSession(d_read, d_write) as straight,
    ):
        clients = {"gateway": through, "direct": straight}
        for client in clients.values():
            await client.initialize()
            await client.list_tools()
        for label, (tool, arguments) in CALLS.items():
            for name, client in clients.items():
                for _ in range(max(5, n // 10)):  # warm up
                    await client.call_tool(tool, arguments)
                out[name][label] = []
            for _ in range(n):
                for name, client in clients.items():
                    started = time.perf_counter()
                    result = await client.call_tool(tool, arguments)
                    out[name][label].append(time.perf_counter() - started)
                    assert not result.is_error, result
    return out


async def _throughput(spec: UpstreamSpec, n: int, concurrency: int) -> float:
    tool, arguments = CALLS["COMPENSABLE"]
    async with bounded_stdio(spec) as (read, write), ClientSession(read, write) as client:
        await client.initialize()
        per_task = n // concurrency

        async def worker() -> None:
            for _ in range(per_task):
                await client.call_tool(tool, arguments)

        started = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for _ in range(concurrency):
                tg.start_soon(worker)
        return per_task * concurrency / (time.perf_counter() - started)


async def _step_costs(folder: Path, n: int) -> dict[str, dict[str, float]]:
    """The governed call alone, in process (no MCP hop): what the gateway's step costs."""
    import sagaplane as sp
    from sagaplane.integrations import core, policy

    rules = policy.load(POLICY)

    async def run_tool(tool: str, arguments: dict[str, Any], key: str | None = None) -> Any:
        return {"ok": True}

    core.register_compensators(rules, run_tool)
    governor = core.Governor(rules)
    wal = sp.WAL(folder / "steps.wal")
    out: dict[str, dict[str, float]] = {}
    async with sp.Saga("bench", wal=wal) as saga:
        for label, (tool, arguments) in CALLS.items():

            async def perform() -> dict[str, Any]:
                return {"id": "ch_1", "amount_cents": 1}

            samples = []
            for i in range(n + max(5, n // 10)):
                started = time.perf_counter()
                await governor.call(saga, tool, arguments, perform)
                if i >= max(5, n // 10):
                    samples.append(time.perf_counter() - started)
            out[label] = _summary(samples)
    wal.close()
    return out


def _fsync_cost(folder: Path, n: int) -> dict[str, float]:
    path = folder / "fsync-probe"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    samples = []
    try:
        for _ in range(n):
            os.write(fd, b"x" * 300 + b"\n")
            started = time.perf_counter()
            getattr(os, "fdatasync", os.fsync)(fd)
            samples.append(time.perf_counter() - started)
    finally:
        os.close(fd)
    return _summary(samples)


def _latency_report(mine: dict[str, list[float]], peer: dict[str, list[float]]) -> dict[str, Any]:
    report: dict[str, Any] = {}
    for label in CALLS:
        ours, theirs = _summary(mine[label]), _summary(peer[label])
        report[label] = {
            "gateway": ours,
            "direct": theirs,
            "added_p50_ms": round(ours["p50_ms"] - theirs["p50_ms"], 3),
            "added_p99_ms": round(ours["p99_ms"] - theirs["p99_ms"], 3),
            "ratio_p50": round(ours["p50_ms"] / theirs["p50_ms"], 3),
        }
        print(
            f"{label:12s} direct p50 {theirs['p50_ms']:7.3f} ms p99 {theirs['p99_ms']:7.3f} ms | "
            f"gateway p50 {ours['p50_ms']:7.3f} ms p99 {ours['p99_ms']:7.3f} ms | "
            f"added p50 {report[label]['added_p50_ms']:+.3f} ms p99 {report[label]['added_p99_ms']:+.3f} ms"
        )
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small counts (CI)")
    parser.add_argument("--calls", type=int, default=None)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    n = args.calls or (100 if args.quick else 2000)
    out = Path(
        args.out
        or ROOT / "bench" / "results" / ("integrations-quick.json" if args.quick else "integrations.json")
    )
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix=".bench-integrations-", dir=ROOT / "bench") as tmp:
        folder = Path(tmp)
        env = {"SHOP_LEDGER": "", "SAGAPLANE_WAL_DIR": str(folder / "wal")}
        direct = UpstreamSpec(command=[sys.executable, str(SHOP)], env=env)
        gateway = UpstreamSpec(
            command=[
                str(SAGAPLANE),
                "mcp-gateway",
                "--policy",
                str(POLICY),
                "--",
                sys.executable,
                str(SHOP),
            ],
            env=env,
        )
        measured = anyio.run(_latencies, gateway, direct, n)
        mine, peer = measured["gateway"], measured["direct"]
        fsync = _fsync_cost(folder, max(50, n // 4))
        steps = anyio.run(_step_costs, folder, n)
        through_gateway = anyio.run(_throughput, gateway, n, args.concurrency)
        through_direct = anyio.run(_throughput, direct, n, args.concurrency)
    load_after = os.getloadavg()[0]
    report = _latency_report(mine, peer)
    print(f"fdatasync p50 {fsync['p50_ms']:.3f} ms p99 {fsync['p99_ms']:.3f} ms")
    for label, cost in steps.items():
        print(
            f"the governed step alone (in process), {label}: "
            f"p50 {cost['p50_ms']:.3f} ms p99 {cost['p99_ms']:.3f} ms"
        )
    print(
        f"calls/s, COMPENSABLE, {args.concurrency} in flight: gateway {through_gateway:.0f}, "
        f"direct {through_direct:.0f} ({through_gateway / through_direct:.2f}x)"
    )
    result = {
        "benchmark": "integrations",
        "quick": args.quick,
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load_before": load_before,
            "load_after": load_after,
        },
        "setup": "mcp ClientSession -> (sagaplane mcp-gateway, stdio, --boundary session, no control "
        "plane) -> sdk/examples/mcp_shop_server.py over stdio; peer: the same client straight to the "
        "same server",
        "calls_per_kind": n,
        "latency": report,
        "fdatasync": fsync,
        "governed_step_in_process": steps,
        "targets": {
            "PREVIEW_added_p50_ms": 1.0,
            "COMPENSABLE_added_p50_ms_max": round(fsync["p50_ms"], 3),
        },
        "throughput": {
            "concurrency": args.concurrency,
            "gateway_calls_per_s": round(through_gateway, 1),
            "direct_calls_per_s": round(through_direct, 1),
        },
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
