"""A flood of ingest for the saturated-recovery test and benchmark, run as its own process (killed
by its caller): THREADS agents each ship batches of BATCH finished sagas as fast as the control
plane takes them, so integration and sealing always have work queued.

usage: flood.py URL API_KEY [THREADS] [BATCH]"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

import httpx
from sagaplane.chain import GENESIS, stamp

PROXY_HEADERS = {"X-Forwarded-Proto": "https"}  # production's TLS terminator says so


def sagas(stream: str, count: int, state: dict[str, Any]) -> list[dict[str, Any]]:
    """`count` finished sagas of three committed steps, chained on from `state` (seq, head)."""
    out = []
    for _ in range(count):
        state["n"] += 1
        saga_id = f"{stream}-{state['n']}"
        items: list[tuple[str, dict[str, Any]]] = [("SAGA_START", {"saga_id": saga_id, "name": "flood"})]
        for step in range(3):
            fields = {"saga_id": saga_id, "step_id": f"{saga_id}-s{step}", "tool": "flood.op", "kwargs": {}}
            items += [("STEP_INTENT", fields), ("STEP_COMMITTED", fields)]
        items.append(("SAGA_COMPLETE", {"saga_id": saga_id}))
        for event, fields in items:
            state["seq"] += 1
            record = {"seq": state["seq"], "ts": round(time.time(), 6), "event": event, **fields}
            state["head"] = stamp(record, state["head"])
            out.append(record)
    return out


def agent(url: str, key: str, name: str, batch: int) -> None:
    state: dict[str, Any] = {"n": 0, "seq": 0, "head": GENESIS}
    headers = {**PROXY_HEADERS, "Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=url, headers=headers, timeout=120) as client:
        while True:
            records = sagas(name, batch, state)
            try:
                client.post(f"/api/v1/streams/{name}/records", json={"records": records})
            except httpx.HTTPError:
                continue  # a timed-out batch was most likely stored: the chain goes on


def main() -> None:
    url, key = sys.argv[1:3]
    threads = int(sys.argv[3]) if len(sys.argv) > 3 else 4
    batch = int(sys.argv[4]) if len(sys.argv) > 4 else 20
    workers = [
        threading.Thread(target=agent, args=(url, key, f"flood-{n}", batch), daemon=True)
        for n in range(threads)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()


if __name__ == "__main__":
    main()
