"""Framework adapters benchmark: what a tool call costs through `sagaplane.integrations.langgraph`
and `sagaplane.integrations.openai_agents`, against the bare `sp.tool` wrapping the same call.

Peers in the same run, their calls interleaved one by one in the same sagas (the same WAL, the
same fsync rounds), no control plane (the gate's round trip is the same for both sides and would
only dilute the ratio):
- LangGraph: a LangChain tool invoked with a tool call (what ToolNode does): bare (no Sagaplane),
  `sp.tool` around that invocation, and the governed tool (`govern(...)`) inside a graph run's saga;
- OpenAI Agents SDK: a FunctionTool's `on_invoke_tool` (what the Runner does): bare, `sp.tool`
  (async) around it, and the governed tool (its `needs_approval` check and its invocation) inside a
  run's saga.
Each for a PREVIEW tool (no fsync: the adapter's own cost is most visible) and a COMPENSABLE one
(the intent fsynced before the effect). Issue 24 target: governed / `sp.tool` <= 1.1x (p50).

    .venv/bin/python bench/adapters.py [--quick]      # writes bench/results/adapters[-quick].json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "sdk"))

import sagaplane as sp  # noqa: E402
from agents import function_tool  # noqa: E402
from agents.tool_context import ToolContext  # noqa: E402
from langchain_core.tools import tool as lc_tool  # noqa: E402
from sagaplane.integrations import langgraph as splg  # noqa: E402
from sagaplane.integrations import openai_agents as spoa  # noqa: E402
from sagaplane.integrations.policy import loads  # noqa: E402

perf = time.perf_counter
POLICY = loads(
    'name = "bench-adapters"\n'
    '[tools.lookup]\nsemantics = "PREVIEW"\n'
    '[tools.reserve]\nsemantics = "COMPENSABLE"\n'
    'compensate = { tool = "release", arguments = { id = "{result.id}" } }\n'
)


def pct(samples: list[float], p: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


def summary(samples: list[float]) -> dict[str, float]:
    return {
        "n": len(samples),
        "p50_us": round(pct(samples, 50) * 1e6, 1),
        "p99_us": round(pct(samples, 99) * 1e6, 1),
        "mean_us": round(statistics.fmean(samples) * 1e6, 1),
    }


# -- the tools ------------------------------------------------------------------------------------


@lc_tool("lookup")
def lc_lookup(sku: str) -> str:
    """Look a product up."""
    return '{"id": "p1"}'


@lc_tool("reserve")
def lc_reserve(sku: str) -> str:
    """Reserve a product."""
    return '{"id": "r1"}'


@lc_tool("release")
def lc_release(id: str) -> str:
    """Release a reservation."""
    return "ok"


@function_tool(name_override="lookup")
def oa_lookup(sku: str) -> str:
    """Look a product up."""
    return '{"id": "p1"}'


@function_tool(name_override="reserve")
def oa_reserve(sku: str) -> str:
    """Reserve a product."""
    return '{"id": "r1"}'


@function_tool(name_override="release")
def oa_release(id: str) -> str:
    """Release a reservation."""
    return "ok"


SEMANTICS = {"lookup": sp.PREVIEW, "reserve": sp.COMPENSABLE}


@sp.compensator("bench-adapters.release")
def release(id: str, idempotency_key: str | None = None) -> None:
    return None


def _compensate(name: str) -> Any:
    if SEMANTICS[name] is sp.PREVIEW:
        return None
    return lambda result: sp.undo("bench-adapters.release", id="r1")


# -- LangGraph ------------------------------------------------------------------------------------


def langgraph_variants(name: str) -> dict[str, Callable[[int], Any]]:
    inner = {"lookup": lc_lookup, "reserve": lc_reserve}[name]
    governed = {t.name: t for t in splg.govern([lc_lookup, lc_reserve, lc_release], policy=POLICY)}[name]
    config: Any = {"configurable": {"thread_id": "bench"}}  # what ToolNode passes every tool
    bare_sp = sp.tool(
        lambda call: inner.invoke(call, config),
        name=name,
        semantics=SEMANTICS[name],
        compensate=_compensate(name),
    )

    def call(i: int) -> dict[str, Any]:
        return {"name": name, "args": {"sku": "mug"}, "id": f"call_{i}", "type": "tool_call"}

    def bare(i: int) -> Any:
        return inner.invoke(call(i), config)

    def wrapped(i: int) -> Any:
        return bare_sp(call(i))

    def adapter(i: int) -> Any:
        return governed.invoke(call(i), config)

    return {"bare": bare, "sp_tool": wrapped, "governed": adapter}


def time_langgraph(name: str, batches: int, per_batch: int) -> dict[str, Any]:
    variants = list(langgraph_variants(name).items())
    samples: dict[str, list[float]] = {label: [] for label, _ in variants}
    counter = 0
    for _ in range(batches):
        # One saga holds the three variants' calls, interleaved call by call (the order rotating):
        # the machine's load and the WAL's fsync rounds move them alike.
        with sp.saga(name="bench-langgraph") as saga:
            splg._runs["bench"] = splg._Run(saga)  # the graph run's saga, as splg.invoke registers it
            try:
                for i in range(per_batch):
                    for label, fn in variants[i % 3 :] + variants[: i % 3]:
                        counter += 1
                        started = perf()
                        fn(counter)
                        samples[label].append(perf() - started)
            finally:
                splg._runs.pop("bench", None)
    return _report(samples)


# -- OpenAI Agents SDK ----------------------------------------------------------------------------


def openai_variants(name: str) -> dict[str, Callable[[int], Awaitable[Any]]]:
    inner = {"lookup": oa_lookup, "reserve": oa_reserve}[name]
    governed = {t.name: t for t in spoa.govern([oa_lookup, oa_reserve, oa_release], policy=POLICY)}[name]
    arguments = json.dumps({"sku": "mug"})

    async def invoke(context: Any, text: str) -> Any:
        return await inner.on_invoke_tool(context, text)

    bare_sp = sp.tool(invoke, name=name, semantics=SEMANTICS[name], compensate=_compensate(name))

    def context(i: int) -> ToolContext[Any]:
        return ToolContext(None, tool_name=name, tool_call_id=f"call_{i}", tool_arguments=arguments)

    async def bare(i: int) -> Any:
        return await inner.on_invoke_tool(context(i), arguments)

    async def wrapped(i: int) -> Any:
        return await bare_sp(context(i), arguments)

    async def adapter(i: int) -> Any:
        ctx = context(i)
        check = governed.needs_approval
        assert callable(check)
        if await check(ctx, {"sku": "mug"}, ctx.tool_call_id):
            raise AssertionError("no approval is configured here")
        return await governed.on_invoke_tool(ctx, arguments)

    return {"bare": bare, "sp_tool": wrapped, "governed": adapter}


async def time_openai(name: str, batches: int, per_batch: int) -> dict[str, Any]:
    variants = list(openai_variants(name).items())
    samples: dict[str, list[float]] = {label: [] for label, _ in variants}
    counter = 0
    for _ in range(batches):
        async with sp.saga(name="bench-openai-agents") as saga:
            token = spoa._current.set(spoa._Run(saga))  # the run's saga, as spoa.run sets it
            try:
                for i in range(per_batch):
                    for label, fn in variants[i % 3 :] + variants[: i % 3]:
                        counter += 1
                        started = perf()
                        await fn(counter)
                        samples[label].append(perf() - started)
            finally:
                spoa._current.reset(token)
    return _report(samples)


def _report(samples: dict[str, list[float]]) -> dict[str, Any]:
    out: dict[str, Any] = {label: summary(values) for label, values in samples.items()}
    out["ratio_governed_to_sp_tool_p50"] = round(out["governed"]["p50_us"] / out["sp_tool"]["p50_us"], 3)
    out["ratio_governed_to_sp_tool_mean"] = round(out["governed"]["mean_us"] / out["sp_tool"]["mean_us"], 3)
    out["adapter_cost_p50_us"] = round(out["governed"]["p50_us"] - out["sp_tool"]["p50_us"], 1)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small counts (CI: a few seconds)")
    parser.add_argument("--out", default=None, help="default: bench/results/adapters[-quick].json")
    args = parser.parse_args(argv)
    out_path = args.out or str(
        REPO / "bench" / "results" / ("adapters-quick.json" if args.quick else "adapters.json")
    )
    batches, per_batch = (4, 50) if args.quick else (20, 250)
    folder = Path(tempfile.mkdtemp(prefix=".bench-adapters-", dir=REPO / "bench"))
    runtime = sp.configure(folder / "adapters.wal", ship=False, gate=False)
    out: dict[str, Any] = {
        "meta": {
            "quick": args.quick,
            "python": platform.python_version(),
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "sagaplane": sp.__version__,
            "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "calls_per_variant": batches * per_batch,
            "load_average_1m_before": round(os.getloadavg()[0], 2),
        }
    }
    try:
        for name in ("lookup", "reserve"):
            label = f"{SEMANTICS[name].value.lower()}"
            out[f"langgraph_{label}"] = time_langgraph(name, batches, per_batch)
            out[f"openai_agents_{label}"] = asyncio.run(time_openai(name, batches, per_batch))
    finally:
        runtime.close()
        sp.shutdown()
        for path in folder.iterdir():
            path.unlink()
        folder.rmdir()
    out["meta"]["load_average_1m_after"] = round(os.getloadavg()[0], 2)
    for key, value in out.items():
        if key == "meta":
            continue
        p50 = {label: value[label]["p50_us"] for label in ("bare", "sp_tool", "governed")}
        print(
            f"{key:28s} p50 bare {p50['bare']:8.1f} us  sp.tool {p50['sp_tool']:8.1f} us  "
            f"governed {p50['governed']:8.1f} us  {value['ratio_governed_to_sp_tool_p50']:.3f}x (<= 1.1x)"
        )
    Path(out_path).parent.mkdir(parents=True, exist_ok=True)
    Path(out_path).write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {out_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
