"""The cosigning loop, so that no busy queue can starve it (the same shape as recovery/sweeper.py).

After each signed checkpoint the integrator queues a cosigning pass (`tasks.cosign_tenant`), which
is quick when workers are free. When they are saturated (a flood of ingest keeps integration and
sealing busy), that message waits behind them, and a beat tick queued like it would expire unrun.
So a thread of the beat process (started on `beat_init`: beat runs exactly once in every
deployment shape and runs no tasks) asks every second which tenants have a witness due and behind
the latest checkpoint (`cross_tenant.tenants_to_cosign`, one indexed query) and runs their passes
itself, a few tenants at a time. A pass is coalesced per tenant with the queued task (the same
claim), so the two never send the same checkpoint twice at once. A witness that is down costs its
own pass its timeout, then is backed off; it slows neither ingest, nor signing, nor other tenants
beyond that pass."""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from django.db import DatabaseError, close_old_connections

log = logging.getLogger(__name__)

EVERY_S = 1.0
TENANTS_AT_ONCE = 4

_started: threading.Thread | None = None
_lock = threading.Lock()


def _one(tenant_id: int) -> None:
    from transparency.tasks import cosign_tenant

    try:
        cosign_tenant(tenant_id)
    except Exception:
        log.exception("cosigning pass of tenant %s failed; the next pass retries", tenant_id)
    finally:
        close_old_connections()


def pass_once(pool: ThreadPoolExecutor) -> int:
    """One pass: every tenant with a witness due and behind. Returns how many were asked."""
    from transparency import cross_tenant

    tenant_ids = cross_tenant.tenants_to_cosign()
    list(pool.map(_one, tenant_ids))
    return len(tenant_ids)


def _loop(stop: threading.Event) -> None:
    with ThreadPoolExecutor(max_workers=TENANTS_AT_ONCE, thread_name_prefix="cosigner") as pool:
        while not stop.is_set():
            began = time.monotonic()
            try:
                pass_once(pool)
            except DatabaseError:
                log.warning("cosigning pass failed (database); the next pass retries", exc_info=True)
            except Exception:
                log.exception("cosigning pass failed; the next pass retries")
            finally:
                close_old_connections()
            stop.wait(max(0.0, EVERY_S - (time.monotonic() - began)))


def on_beat_init(**kwargs: object) -> None:
    start()


def start() -> threading.Thread:
    """Start the loop in this process (once; a daemon thread: it ends with the process)."""
    global _started
    with _lock:
        if _started is None or not _started.is_alive():
            _started = threading.Thread(target=_loop, args=(threading.Event(),), name="cosigner", daemon=True)
            _started.start()
        return _started
