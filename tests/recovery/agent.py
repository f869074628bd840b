"""An agent for the crash tests, run as its own process and SIGKILLed by them.

usage: agent.py MODE SAGA_ID WAL [CHARGES] [LEASE_TTL]
- hang: charge CHARGES times inside one saga, say "charged" on stdout, then hang (to be killed);
- rollback: charge CHARGES times, then fail, so the SDK rolls back newest first (SHOP_BLOCK_AFTER_REFUNDS
  makes a refund hang mid-rollback, to be killed there)."""

from __future__ import annotations

import sys
import threading

import sagaplane as sp

from tests.recovery import shop


def main() -> None:
    mode, saga_id, wal = sys.argv[1:4]
    charges = int(sys.argv[4]) if len(sys.argv) > 4 else 1
    lease_ttl = float(sys.argv[5]) if len(sys.argv) > 5 else 2.0
    sp.configure(wal, gate=False, agent="crash-test-agent")
    with sp.saga(name="checkout", saga_id=saga_id, lease_ttl=lease_ttl):
        for n in range(1, charges + 1):
            shop.charge(charge_id=f"{saga_id}-ch{n}", amount=10 * n)
        print("charged", flush=True)
        if mode == "hang":
            threading.Event().wait()
        raise RuntimeError("the agent gives up: roll back")


if __name__ == "__main__":
    main()
