"""An agent process that dies holding a budget lease (tests/fleet/test_lease_settlement.py).

    python -m tests.fleet.lease_agent WAL CALLS

Configures the SDK from the environment (SAGAPLANE_URL, SAGAPLANE_API_KEY) with budget leases on
and its WAL shipped, makes CALLS calls of `llm.complete(amount=1)`, each its own saga (decided in
process on leases), says "spent" and waits to be SIGKILLed, holding the lease it was last granted.
"""

from __future__ import annotations

import sys
import threading

import sagaplane as sp


def main() -> None:
    wal, calls = sys.argv[1], int(sys.argv[2])
    runtime = sp.configure(wal, agent="dying-agent", gate_leases=True)
    assert runtime.gate is not None and runtime.gate.leases is not None
    runtime.gate.refresh()
    complete = sp.tool(lambda amount: amount, name="llm.complete", semantics=sp.REVERSIBLE)
    for _ in range(calls):
        with sp.saga(name="spend"):
            complete(1)
    print("spent", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
