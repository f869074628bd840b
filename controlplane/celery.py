"""The Celery app. In embedded mode the broker is kombu's filesystem transport under the data
folder, so `celery -A controlplane worker -B` runs with no server at all.

Warm shutdown (SIGTERM) makes Celery stop taking tasks and wait for the running ones, and a pool
process busy with a long integration used to hold the whole worker until it finished (or the
orchestrator's SIGKILL came). `keep_going()` lets long tasks see the shutdown: they check it
between chunks, stop with their work committed, and leave the rest to the next worker."""

from __future__ import annotations

import multiprocessing
import os
from typing import Any

from celery import Celery, signals

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")

app = Celery("controlplane")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


# A byte in shared memory, created in the worker's main process before the pool forks, so every
# pool process reads the flag the main process sets. No lock: a signal handler sets it, and a
# lock held by a pool process killed at the wrong moment would hang the next shutdown.
_shutting_down: Any = None


@signals.worker_init.connect
def _share_shutdown_flag(**kwargs: Any) -> None:
    global _shutting_down
    _shutting_down = multiprocessing.RawValue("b", 0)


@signals.worker_init.connect
@signals.beat_init.connect
def _refuse_unsafe_database_role(**kwargs: Any) -> None:
    """A worker or beat whose database role row-level security does not bind must not start
    (tenants/rls.py). SystemExit: Celery logs and ignores ordinary exceptions from receivers."""
    from controlplane.config import ConfigurationError
    from tenants.rls import refuse_unsafe_runtime_role

    try:
        refuse_unsafe_runtime_role()
    except ConfigurationError as exc:
        raise SystemExit(str(exc)) from exc


@signals.worker_process_init.connect
def _trace_tasks(**kwargs: Any) -> None:
    """Each pool process exports its own spans (an exporter's thread does not survive a fork)."""
    from controlplane.tracing import configure_tracing

    configure_tracing("sagaplane-worker")


@signals.worker_shutting_down.connect
def _announce_shutdown(**kwargs: Any) -> None:
    if _shutting_down is not None:
        _shutting_down.value = 1


def keep_going() -> bool:
    """False once this process' worker has been asked to shut down (always True outside a worker)."""
    return _shutting_down is None or not _shutting_down.value
