"""Whether this worker process may keep going: long Celery tasks ask between chunks.

Warm shutdown (SIGTERM) makes Celery stop taking tasks and wait for the running ones, and a pool
process busy with a long integration used to hold the whole worker until it finished (or the
orchestrator's SIGKILL came). `keep_going()` lets long tasks see the shutdown: they check it
between chunks, stop with their work committed, and leave the rest to the next worker. The
signal receivers are connected when the Celery app (`controlplane.celery`) imports this module."""

from __future__ import annotations

import multiprocessing
from typing import Any

from celery import signals

# A byte in shared memory, created in the worker's main process before the pool forks, so every
# pool process reads the flag the main process sets. No lock: a signal handler sets it, and a
# lock held by a pool process killed at the wrong moment would hang the next shutdown.
_shutting_down: Any = None


@signals.worker_init.connect
def _share_shutdown_flag(**kwargs: Any) -> None:
    global _shutting_down
    _shutting_down = multiprocessing.RawValue("b", 0)


@signals.worker_shutting_down.connect
def _announce_shutdown(**kwargs: Any) -> None:
    if _shutting_down is not None:
        _shutting_down.value = 1


def keep_going() -> bool:
    """False once this process' worker has been asked to shut down (always True outside a worker)."""
    return _shutting_down is None or not _shutting_down.value
