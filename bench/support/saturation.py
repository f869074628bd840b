"""Saturated workers for the recovery benchmark's second phase (issue 23): the deployment's own
Celery worker with its beat (`worker -B --concurrency=2`, as `make run` and the crash tests run
it: the beat's sweeper thread takes expired leases over, no sweep in the benchmark's process), and
around it the load that starved the old beat message: a flood of ingest keeping integration and
sealing busy (tests/recovery/flood.py, the saturated test's own) and CPU hogs, two per core.
Started and stopped by their process ids only."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support.processes import stop_group
from tests.support.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
FLOOD = ROOT / "tests" / "recovery" / "flood.py"


@contextmanager
def celery_with_beat(env: dict[str, str], folder: Path) -> Iterator[subprocess.Popen[bytes]]:
    """The worker and its beat; yields once the beat's sweeper has finished a pass."""
    from recovery import sweeper
    from recovery.models import SweepPass

    SweepPass.objects.all().delete()
    process = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "celery"), "-A", "controlplane", "worker", "-B",
            "--concurrency=2", "--loglevel=WARNING", "-s", str(folder / "beat-schedule"),
        ],
        cwd=ROOT, env=env, stdout=(folder / "celery.log").open("w"), stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    try:
        wait_until(
            lambda: sweeper.status()["status"] == "ok",
            "the beat's sweeper to run",
            deadline=180,
            every=0.5,
            alive=process,
            context=lambda: (folder / "celery.log").read_text()[-3000:],
        )
        yield process
    finally:
        stop_group(process)


@contextmanager
def saturated(url: str, key: str, folder: Path, *, threads: int = 4, batch: int = 20) -> Iterator[None]:
    """CPU hogs (two per core) and `threads` agents flooding ingest with `batch` sagas a request."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'sdk'}"}
    from tests.support.load import cpu_hogs

    load = cpu_hogs()
    load.append(
        subprocess.Popen(
            [sys.executable, str(FLOOD), url, key, str(threads), str(batch)],
            cwd=ROOT,
            env=env,
            stdout=(folder / "flood.log").open("w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    )
    try:
        yield
    finally:
        for process in load:
            stop_group(process)
