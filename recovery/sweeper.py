"""The sweep's own loop, so that no busy queue can starve it (issue 23).

The sweep used to be a beat message (`recovery.sweep`, every second, expiring after 2 s) in the
queue every Celery worker shares: behind integration and sealing tasks on busy workers it expired
unrun, and dead agents' sagas were never taken over. Now it is a thread of the beat process
(started on `beat_init`, recovery/apps.py): beat runs exactly once in every deployment shape
(embedded `worker -B`, one worker, the cluster's own beat), runs no tasks, and so nothing queues
in front of the thread. Workers' claims take over their own tenant's expired leases as well
(`services.take_over_on_claim`); this loop is what takes them over when no worker claims
(webhooks, sagas with no handler), escalates, wakes webhook deliveries and chains what results
left pending. The same thread settles the budget leases their holders never returned
(`fleet.services.settle_all_expired_leases`), after the recovery sweep of each pass.

Each pass records when it finished (`SweepPass`); its age is the sweep's lag, read by `/metrics`
(`sagaplane_recovery_sweep_lag_seconds`), `/readyz` (detail) and the dashboard (a banner past
LAG_WARN_S)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime

from django.db import DatabaseError, close_old_connections
from django.utils import timezone

from recovery.models import SweepPass

log = logging.getLogger(__name__)

EVERY_S = 1.0  # a pass starts this long after the last one started (at once when it took longer)
LAG_WARN_S = 10.0  # a sweep this late is reported as lagging

_started: threading.Thread | None = None
_lock = threading.Lock()


def record_pass(*, started: float, tenants: int, failures: int) -> None:
    """The pass that began at `started` (time.monotonic()) is done."""
    SweepPass.objects.update_or_create(
        pk=1,
        defaults={
            "finished_at": timezone.now(),
            "took_s": round(time.monotonic() - started, 3),
            "tenants": tenants,
            "failures": failures,
        },
    )


def last_pass() -> SweepPass | None:
    return SweepPass.objects.filter(pk=1).first()


def lag_seconds(now: datetime | None = None) -> float | None:
    """Seconds since the sweep last finished a pass (0 for one that just did); None when no pass
    ever ran (a fresh install whose beat has not started yet)."""
    found = last_pass()
    if found is None:
        return None
    return max(0.0, ((now or timezone.now()) - found.finished_at).total_seconds())


def status(now: datetime | None = None) -> dict[str, object]:
    """The sweep's health as /readyz and the dashboard show it: `ok`, `lagging` (no pass for
    LAG_WARN_S) or `never_ran`, with the lag in seconds."""
    lag = lag_seconds(now)
    if lag is None:
        return {"status": "never_ran", "lag_s": None}
    return {"status": "lagging" if lag > LAG_WARN_S else "ok", "lag_s": round(lag, 1)}


def passes() -> list[Callable[[], object]]:
    """What each pass runs, in order, each on its own: recovery's sweep, then the settlement of
    budget leases their holders never returned (fleet; the same promise: every second however
    busy the workers are)."""
    from fleet.services import settle_all_expired_leases
    from recovery.tasks import sweep_all

    return [sweep_all, settle_all_expired_leases]


def _loop(stop: threading.Event) -> None:
    work = passes()
    while not stop.is_set():
        began = time.monotonic()
        for one in work:
            try:
                one()
            except DatabaseError:
                log.warning("sweep pass %s failed (database); the next pass retries", one, exc_info=True)
            except Exception:
                log.exception("sweep pass %s failed; the next pass retries", one)
            finally:
                close_old_connections()  # a connection broken by an outage is replaced, not reused
        stop.wait(max(0.0, EVERY_S - (time.monotonic() - began)))


def lag_series() -> list[tuple[dict[str, str], float]]:
    """sagaplane_recovery_sweep_lag_seconds: +Inf while no pass ever ran."""
    lag = lag_seconds()
    return [({}, float("inf") if lag is None else lag)]


def on_beat_init(**kwargs: object) -> None:
    start()


def start() -> threading.Thread:
    """Start the loop in this process (once; a daemon thread: it ends with the process)."""
    global _started
    with _lock:
        if _started is None or not _started.is_alive():
            _started = threading.Thread(
                target=_loop, args=(threading.Event(),), name="recovery-sweeper", daemon=True
            )
            _started.start()
        return _started
