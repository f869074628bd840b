"""The shop the crash tests charge and refund: a SQLite ledger (SHOP_LEDGER) that counts every
refund attempt separately from the refunds applied. A refund is applied at most once per
idempotency key, as a payment API does; two different keys for one charge would be two refunds.

Knobs for the tests, from the environment: SHOP_REFUND_SLEEP (seconds each refund takes, after
its attempt is recorded), SHOP_BLOCK_AFTER_REFUNDS (in this process, after that many refunds
the next one hangs before doing anything: an agent to kill mid-rollback)."""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from typing import Any

import sagaplane as sp

_done = 0
_lock = threading.Lock()


def _db() -> sqlite3.Connection:
    db = sqlite3.connect(os.environ["SHOP_LEDGER"], timeout=60, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("CREATE TABLE IF NOT EXISTS charges (id TEXT PRIMARY KEY, amount INTEGER, pid INTEGER)")
    db.execute(
        "CREATE TABLE IF NOT EXISTS attempts (charge_id TEXT, idempotency_key TEXT, pid INTEGER, at REAL)"
    )
    db.execute(
        "CREATE TABLE IF NOT EXISTS refunds"
        " (idempotency_key TEXT PRIMARY KEY, charge_id TEXT, pid INTEGER, at REAL)"
    )
    return db


@sp.compensator("shop.refund")
def refund(charge_id: str, idempotency_key: str | None = None) -> None:
    global _done
    block_after = os.environ.get("SHOP_BLOCK_AFTER_REFUNDS")
    if block_after is not None and _done >= int(block_after):
        threading.Event().wait()  # hangs until the process is killed
    with _db() as db:
        db.execute(
            "INSERT INTO attempts VALUES (?, ?, ?, ?)", (charge_id, idempotency_key, os.getpid(), time.time())
        )
    time.sleep(float(os.environ.get("SHOP_REFUND_SLEEP", "0")))
    with _db() as db:
        db.execute(
            "INSERT OR IGNORE INTO refunds VALUES (?, ?, ?, ?)",
            (idempotency_key, charge_id, os.getpid(), time.time()),
        )
    with _lock:
        _done += 1


@sp.compensator("shop.refund_by_hook")
def refund_by_hook(charge_id: str, idempotency_key: str | None = None) -> None:
    """The same refund, named for the webhook test: the agent registers it (so its compensation is
    recoverable), and recovery delivers its jobs to the tenant's webhook, never to SDK workers."""
    refund(charge_id, idempotency_key)


def _charge(charge_id: str, amount: int) -> dict[str, Any]:
    with _db() as db:
        db.execute("INSERT INTO charges VALUES (?, ?, ?)", (charge_id, amount, os.getpid()))
    return {"id": charge_id}


charge = sp.tool(
    _charge,
    name="shop.charge",
    semantics=sp.COMPENSABLE,
    # SHOP_REFUND_HANDLER names the compensation (a webhook-delivered one in the webhook test).
    compensate=lambda result: sp.undo(
        os.environ.get("SHOP_REFUND_HANDLER", "shop.refund"), charge_id=result["id"]
    ),
)
