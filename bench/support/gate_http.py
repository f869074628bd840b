"""The gate benchmark over HTTP: the production server (gunicorn), the load generator, and how long a
halt takes to reach an SDK gate in another process."""

from __future__ import annotations

import asyncio
import json
import math
import os
import statistics
import subprocess
import sys
import textwrap
import time
import urllib.parse
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.support.gate_common import (  # noqa: E402
    ROOT,
    Run,
    _call_args,
    _overspend_check,
    _summary,
    perf,
)
from bench.support.gate_inprocess import _warm_redis_marker
from tests.support.gunicorn import gunicorn
from tests.support.production_env import production_env

# ---------------------------------------------------------------------------------------------- HTTP


def _server_env(db_url: str, redis_url: str, data_dir: Path, store_name: str) -> dict[str, str]:
    """The production configuration (tests/support/production_env.py) with this process' keys (so
    what it made in process can be read by the server), no redirect (the SDK's long-poll speaks
    plain http to it) and the limit store under measurement."""
    return production_env(
        db_url,
        redis_url,
        data_dir,
        SECRET_KEY=os.environ["SECRET_KEY"],
        SAGAPLANE_MASTER_KEY=os.environ["SAGAPLANE_MASTER_KEY"],
        SECURE_SSL_REDIRECT="0",
        SAGAPLANE_GATE_STORE=store_name,
    )


_server_pids: dict[str, int] = {}  # url -> the gunicorn master's pid (for its CPU seconds)


def _tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) used so far by `pid` and its live children (gunicorn workers)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    pids = [pid]
    try:
        pids += [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        pass
    for one in pids:
        try:
            fields = Path(f"/proc/{one}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / ticks  # utime, stime
    return total


@contextmanager
def _gunicorn(env: dict[str, str], workers: int, log: Path) -> Iterator[str]:
    """The README's production command on a free loopback port."""

    # The production URL map names a static file (the favicon): its manifest must be in this
    # run's STATIC_ROOT, as `infra/cluster.sh up` collects it before starting the server.
    subprocess.run(
        [sys.executable, "manage.py", "collectstatic", "--noinput", "-v0"], cwd=ROOT, env=env, check=True
    )
    with gunicorn(env, log, workers=workers, probe_headers={"X-Forwarded-Proto": "https"}) as (url, process):
        _server_pids[url] = process.pid
        try:
            yield url
        finally:
            _server_pids.pop(url, None)


async def _http_load(
    port: int, key: str, bodies: list[list[bytes]]
) -> tuple[list[float], int, float, list[str]]:
    """One keep-alive HTTP/1.1 connection per client, each POSTing its bodies in turn.

    A minimal client on purpose: the load generator shares the server's 2 cores, and a full HTTP
    library's per-request cost (several times this one's) would be measured as the server's."""
    head = (
        "POST /api/v1/gate/evaluate HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n"
        "X-Forwarded-Proto: https\r\nContent-Length: "
    ).encode()
    latencies: list[float] = []
    errors: list[str] = []
    allowed = 0

    async def client(mine: list[bytes], ready: asyncio.Event) -> None:
        nonlocal allowed
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        await ready.wait()
        try:
            for body in mine:
                t0 = perf()
                writer.write(head + str(len(body)).encode() + b"\r\n\r\n" + body)
                status = await reader.readline()
                length = -1
                while (line := await reader.readline()) not in (b"\r\n", b""):
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                if length < 0:
                    raise RuntimeError(f"no Content-Length in the answer to a gate call: {status!r}")
                payload = await reader.readexactly(length)
                latencies.append(perf() - t0)
                if not status.startswith(b"HTTP/1.1 200"):
                    errors.append(f"{status.decode().strip()} {payload[:200]!r}")
                elif json.loads(payload)["decision"] == "allow":
                    allowed += 1
        finally:
            writer.close()

    ready = asyncio.Event()
    tasks = [asyncio.create_task(client(mine, ready)) for mine in bodies]
    await asyncio.sleep(0.5)  # let every connection open before the clock starts
    t0 = perf()
    ready.set()
    await asyncio.gather(*tasks)
    return latencies, allowed, perf() - t0, errors


def over_http(url: str, store_name: str, limits: int, clients: int, total: int) -> dict[str, Any]:
    run = Run(limits, total, keys=True)
    if store_name == "redis":
        _warm_redis_marker(run.tenant)
    port = int(urllib.parse.urlsplit(url).port or 80)
    per_client = total // clients
    prefix = uuid.uuid4().hex[:8]
    bodies = [
        [
            json.dumps(
                {
                    "saga_id": f"{prefix}-{n}-{i}",
                    "step_id": "1",
                    "tool": "bench.charge",
                    "args": _call_args(n),
                    "agent": f"agent-{n % 4}",
                }
            ).encode()
            for i in range(per_client)
        ]
        for n in range(clients)
    ]
    # Warm-up: every worker has loaded its URLconf and opened its pool (an ungoverned tool: no debit).
    warm = [
        [json.dumps({"saga_id": f"w-{n}", "step_id": "1", "tool": "warm.up"}).encode()] * 4 for n in range(4)
    ]
    asyncio.run(_http_load(port, run.gate_key, warm))
    server_pid = _server_pids.get(url)
    server_cpu, client_cpu = _tree_cpu_s(server_pid) if server_pid else 0.0, time.process_time()
    latencies, allowed, wall, errors = asyncio.run(_http_load(port, run.gate_key, bodies))
    server_cpu = (_tree_cpu_s(server_pid) - server_cpu) if server_pid else math.nan
    client_cpu = time.process_time() - client_cpu
    if errors:
        raise SystemExit(f"{len(errors)} gate call(s) failed, first: {errors[0]}")
    decisions = per_client * clients
    return {
        "store": store_name,
        "clients": clients,
        "limits": limits,
        **_summary(latencies, wall),
        # CPU per decision of the server's processes (gunicorn and its workers) and of this load
        # generator: what 2 idle cores would have to cover, before Postgres' and Redis' own.
        "server_cpu_ms_per_decision": round(server_cpu * 1000 / decisions, 3),
        "load_generator_cpu_ms_per_decision": round(client_cpu * 1000 / decisions, 3),
        "budget": _overspend_check(allowed, per_client * clients, run.cap, run.ledger_spent()),
    }


# --------------------------------------------------------------------------------- halt propagation

# An agent in a process of its own: `python -c WATCHER URL KEY REASON`; each line "until-refused"
# or "until-allowed" on its stdin is answered with the time its own view of the fleet first did
# so (refused for REASON, nothing else).
WATCHER = textwrap.dedent(
    """
    import sys, time
    from sagaplane.gate import Call, Gate, GateDenied

    gate = Gate(sys.argv[1], sys.argv[2]).start()
    call = Call(saga_id="watch", step_id="1", tool="bench.charge", semantics="COMPENSABLE", args={})

    def refused():
        try:
            gate.check(call)
            return False
        except GateDenied as denied:
            if denied.reason != sys.argv[3]:
                raise
            return True

    print("ready" if gate.status()["ready"] else "not-ready", flush=True)
    for line in sys.stdin:
        want = line.strip() == "until-refused"
        started = time.monotonic()
        while refused() != want and time.monotonic() - started < 30:
            time.sleep(0.001)  # this agent's own view: no request, the long-poll thread keeps it
        print(repr(time.time()) if refused() == want else "timeout", flush=True)
    """
)


def reach_ms(
    url: str,
    key: str,
    refusal: str,
    trials: int,
    *,
    trigger: Callable[[int], float],
    reset: Callable[[], None],
    what: str,
) -> list[float]:
    """How long `what` takes to reach an SDK in another process (WATCHER), in ms per trial: the
    watcher waits until its tool is refused with `refusal`; `trigger(trial)` sets the cause off and
    returns when; `reset()` clears it and the watcher waits until the tool is allowed again."""
    watcher = subprocess.Popen(
        [sys.executable, "-c", WATCHER, url, key, refusal],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT / "sdk")},
    )
    assert watcher.stdin is not None and watcher.stdout is not None
    seconds: list[float] = []
    try:
        if watcher.stdout.readline().strip() != "ready":
            raise SystemExit("the SDK gate never read the fleet state")
        for trial in range(trials):
            watcher.stdin.write("until-refused\n")
            watcher.stdin.flush()
            started = trigger(trial)
            seen = watcher.stdout.readline().strip()
            if seen == "timeout":
                raise SystemExit(f"{what} did not reach the SDK within 30 s")
            seconds.append(float(seen) - started)
            reset()
            watcher.stdin.write("until-allowed\n")
            watcher.stdin.flush()
            if watcher.stdout.readline().strip() == "timeout":
                raise SystemExit(f"the end of {what} did not reach the SDK within 30 s")
    finally:
        watcher.kill()
        watcher.wait(timeout=30)
    return [s * 1000 for s in seconds]


def halt_reach(url: str, trials: int) -> dict[str, Any]:
    """Engage a halt over the API; time until a waiting SDK Gate in another process refuses."""
    import httpx

    # No limit: the watched tool is ungoverned, so the SDK decides it locally from the long-polled
    # state (no request per check) and only the halt can refuse it.
    run = Run(0, 2, keys=True)
    operator = httpx.Client(
        base_url=url,
        headers={"Authorization": f"Bearer {run.control_key}", "X-Forwarded-Proto": "https"},
        timeout=30,
    )
    halt_ids: list[str] = []

    def engage(_trial: int) -> float:
        engaged = time.time()
        response = operator.post("/api/v1/fleet/halts", json={"scope": "tool:bench.*", "reason": "bench"})
        assert response.status_code == 201, response.text
        halt_ids.append(response.json()["id"])
        return engaged

    def lift() -> None:
        assert operator.delete(f"/api/v1/fleet/halts/{halt_ids[-1]}").status_code == 204

    try:
        ms = reach_ms(url, run.gate_key, "halted", trials, trigger=engage, reset=lift, what="a halt")
    finally:
        operator.close()
    return {
        "trials": trials,
        "p50_ms": round(statistics.median(ms), 1),
        "max_ms": round(max(ms), 1),
        "all_ms": [round(x, 1) for x in ms],
        "target_ms": 1000,
    }
