"""A demo agent for Sagaplane: a checkout bot whose sagas sometimes fail.

    SAGAPLANE_URL=http://127.0.0.1:8000 SAGAPLANE_API_KEY=sp_... python sdk/examples/demo_agent.py --sagas 30
    SAGAPLANE_WAL_DIR=/tmp/demo SAGAPLANE_URL=... SAGAPLANE_API_KEY=... \
        python sdk/examples/demo_agent.py --forever

Most sagas complete; some fail and roll back cleanly; some roll back only partly
(a refund that keeps failing, a receipt e-mail that cannot be unsent). With no
SAGAPLANE_URL it just writes the local WAL. `seed_demo` runs this to populate a
demo tenant. Exit status is 0 when every record reached the control plane.

`--forever` keeps running sagas, with a short pause between them, until it is killed
(SIGTERM or Ctrl-C flushes what it can and exits). The WAL is `--wal`, else
`$SAGAPLANE_WAL_DIR/demo-agent.wal`, else `$SAGAPLANE_WAL`, else `./demo-agent.wal`.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys
import threading
from typing import Any

import sagaplane as sp

STATE: dict[str, Any] = {
    "inventory": {"sku-1": 50, "sku-2": 50},
    "charges": {},
    "shipments": {},
    "payouts": {},
    "payout_ids": set(),
    "refunded": set(),  # the "payment provider's" refunds, as its observer reads them
    "cancelled": set(),  # the "carrier's" cancelled shipments
}
RNG = random.Random(0)
FLAKY_REFUNDS: set[str] = set()  # charge ids whose refund the "payment provider" refuses


@sp.compensator("demo.release_inventory")
def release_inventory(sku: str, qty: int) -> None:
    STATE["inventory"][sku] += qty


@sp.compensator("demo.refund")
def refund(charge_id: str, idempotency_key: str) -> None:
    if charge_id in FLAKY_REFUNDS:
        raise ConnectionError(f"payment provider timed out refunding {charge_id}")
    STATE["charges"].pop(charge_id, None)
    STATE["refunded"].add(charge_id)


@sp.compensator("demo.cancel_shipment")
def cancel_shipment(shipment_id: str, idempotency_key: str) -> None:
    STATE["shipments"].pop(shipment_id, None)
    STATE["cancelled"].add(shipment_id)


@sp.compensator("demo.reverse_payout")
def reverse_payout(payout_id: str, idempotency_key: str) -> None:
    STATE["payouts"].pop(payout_id, None)


# Observers (`@sp.reconciler`): after a rollback, the control plane asks whether each compensated
# effect is really reversed. These read this process's stand-in "provider" state; an effect from
# another run (the seeded history) is one they cannot see: None, unverifiable, never assumed fine.
@sp.reconciler("demo.refund")
def refund_landed(charge_id: str) -> bool | None:
    if charge_id in STATE["refunded"]:
        return True
    return False if charge_id in STATE["charges"] else None


@sp.reconciler("demo.cancel_shipment")
def shipment_cancelled(shipment_id: str) -> bool | None:
    if shipment_id in STATE["cancelled"]:
        return True
    return False if shipment_id in STATE["shipments"] else None


@sp.reconciler("demo.reverse_payout")
def payout_reversed(payout_id: str) -> bool | None:
    return None if payout_id not in STATE["payout_ids"] else payout_id not in STATE["payouts"]


@sp.tool(semantics=sp.PREVIEW)
def quote(sku: str, qty: int) -> int:
    return qty * (1999 if sku == "sku-1" else 4999)


@sp.tool(semantics=sp.REVERSIBLE, compensate=lambda r: sp.undo("demo.release_inventory", sku=r[0], qty=r[1]))
def reserve_inventory(sku: str, qty: int) -> tuple[str, int]:
    if STATE["inventory"][sku] < qty:
        raise sp.EffectNotApplied(f"only {STATE['inventory'][sku]} of {sku} left")
    STATE["inventory"][sku] -= qty
    return sku, qty


@sp.tool(semantics=sp.COMPENSABLE, compensate=lambda r: sp.undo("demo.refund", charge_id=r["id"]))
def charge_card(customer: str, amount_cents: int) -> dict[str, Any]:
    charge_id = f"ch_{RNG.getrandbits(40):010x}"
    STATE["charges"][charge_id] = amount_cents
    return {"id": charge_id, "amount": amount_cents}


@sp.tool(semantics=sp.COMPENSABLE, compensate=lambda r: sp.undo("demo.cancel_shipment", shipment_id=r))
def create_shipment(customer: str, sku: str) -> str:
    if RNG.random() < 0.25:
        raise RuntimeError("carrier API returned 502")
    shipment_id = f"shp_{RNG.getrandbits(32):08x}"
    STATE["shipments"][shipment_id] = customer
    return shipment_id


@sp.tool(
    semantics=sp.COMPENSABLE,
    compensate=lambda r: sp.undo("demo.reverse_payout", payout_id=r),
    reason=lambda a: f"monthly invoice of {a['supplier']}, due today",
)
def pay_supplier(supplier: str, amount: int, currency: str = "USD") -> str:
    """Needs a person's approval in the demo tenant (`seed_demo`'s approval policy). `amount` and
    `currency` are what an approval request shows (e.g. "4,500 USD")."""
    payout_id = f"po_{RNG.getrandbits(32):08x}"
    STATE["payouts"][payout_id] = amount
    STATE["payout_ids"].add(payout_id)
    return payout_id


@sp.tool(semantics=sp.IRREVERSIBLE)
def send_receipt(customer: str, amount_cents: int) -> None:
    pass  # an e-mail cannot be unsent


def approve_small_receipts(request: sp.ConfirmRequest) -> bool:
    """The confirmation hook: stands in for a human approval until the control plane's is plugged in."""
    return int(request.kwargs.get("amount_cents", 0)) < 20000


def checkout(i: int) -> str:
    customer = f"cust-{i % 7}"
    sku = RNG.choice(["sku-1", "sku-2"])
    if STATE["inventory"][sku] < 10:  # the warehouse restocks, so a long demo keeps completing sagas
        STATE["inventory"][sku] += 50
    qty = RNG.randint(1, 4)
    amount = quote(sku, qty)
    receipt_first = RNG.random() < 0.2
    try:
        with sp.saga(name="checkout", confirm=approve_small_receipts) as saga:
            reserve_inventory(sku, qty)
            charge = charge_card(customer, amount)
            if RNG.random() < 0.15:
                FLAKY_REFUNDS.add(charge["id"])
            if receipt_first:
                send_receipt(customer, amount)
            create_shipment(customer, sku)
            if not receipt_first:
                send_receipt(customer, amount)
        return f"{saga.saga_id}: complete"
    except sp.SagaAborted as aborted:
        return f"{saga.saga_id}: aborted ({aborted.cause!r}); {aborted.report.summary()}"


def supplier_payout(i: int) -> str:
    """A payout waiting for an approver (the demo's approval policy): the call waits until someone
    approves it on the Approvals page (then it runs), denies it, or lets it expire (both refuse)."""
    supplier = ["Acme Paper", "Northwind Freight", "Globex Cloud"][i % 3]
    try:
        with sp.saga(name="supplier payout") as saga:
            pay_supplier(supplier, RNG.randint(20, 90) * 100, currency="USD")
        return f"{saga.saga_id}: payout approved and sent"
    except sp.SagaAborted as aborted:
        return f"{saga.saga_id}: payout not sent ({aborted.cause!r})"


def keep_paying_suppliers(stop: threading.Event, quiet: bool, pause: float) -> None:
    """One payout at a time, beside the checkouts (each waits for people for as long as it takes)."""
    i = 0
    while not stop.is_set():
        line = supplier_payout(i)
        i += 1
        if not quiet:
            print(line, flush=True)
        stop.wait(pause)  # a demo's pacing, not synchronisation


def keep_observing(stop: threading.Event) -> None:
    """Answer the control plane's reconciliation checks for this process's compensations."""
    worker = sp.ReconcileWorker(name="demo-agent observer")
    threading.Thread(target=worker.run, name="demo-observer", daemon=True).start()
    stop.wait()
    worker.stop()


def default_wal() -> str:
    wal_dir = os.environ.get("SAGAPLANE_WAL_DIR")
    if wal_dir:
        return os.path.join(wal_dir, "demo-agent.wal")
    return os.environ.get("SAGAPLANE_WAL", "demo-agent.wal")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sagas", type=int, default=int(os.environ.get("DEMO_SAGAS", "20")))
    parser.add_argument("--wal", default=None, help="WAL file (default: $SAGAPLANE_WAL_DIR/demo-agent.wal)")
    parser.add_argument("--forever", action="store_true", help="keep running sagas until killed")
    parser.add_argument("--pause", type=float, default=1.5, help="seconds between sagas with --forever")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--no-ship", action="store_true", help="only write the local WAL")
    parser.add_argument("--quiet", action="store_true")
    parser.add_argument("--agent", default="demo-agent", help="the name the dashboard shows for this agent")
    args = parser.parse_args(argv)
    RNG.seed(args.seed)
    runtime = sp.configure(
        args.wal or default_wal(), ship=False if args.no_ship else None, agent=args.agent or None
    )
    outcomes = {"complete": 0, "clean rollback": 0, "partial rollback": 0}
    stop = threading.Event()
    if args.forever:
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        if not args.no_ship and os.environ.get("SAGAPLANE_URL"):
            threading.Thread(target=keep_observing, args=(stop,), name="observer", daemon=True).start()
            payouts = (stop, args.quiet, max(args.pause, 1.0) * 20)
            threading.Thread(target=keep_paying_suppliers, args=payouts, name="payouts", daemon=True).start()
    i = 0
    while not stop.is_set() and (args.forever or i < args.sagas):
        try:
            line = checkout(i)
        except KeyboardInterrupt:
            break
        i += 1
        if line.endswith("complete"):
            outcomes["complete"] += 1
        elif "PARTIAL" in line:
            outcomes["partial rollback"] += 1
        else:
            outcomes["clean rollback"] += 1
        if not args.quiet:
            print(line, flush=True)
        if args.forever:
            try:
                stop.wait(args.pause)  # a demo's pacing, not synchronisation
            except KeyboardInterrupt:
                break
    shipped = runtime.flush(10 if args.forever else 60)
    where = runtime.shipper.client.url if runtime.shipper else "nowhere (local WAL only)"
    print(
        f"{i} saga(s): {outcomes}; WAL {runtime.wal.path} stream {runtime.wal.stream_id}; "
        f"shipped to {where}: {'yes' if shipped else 'NOT YET'}"
    )
    sp.shutdown()
    return 0 if shipped else 1


if __name__ == "__main__":
    sys.exit(main())
