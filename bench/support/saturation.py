"""Saturated workers for the recovery benchmark's second phase (issue 23): the deployment's own
Celery worker with its beat (`worker -B --concurrency=2`, as `make run` and the crash tests run
it: the beat's sweeper thread takes expired leases over, no sweep in the benchmark's process), and
around it the load that starved the old beat message: a flood of ingest keeping integration and
sealing busy (tests/recovery/flood.py, the saturated test's own) and CPU hogs, two per core.
Started and stopped by their process ids only."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FLOOD = ROOT / "tests" / "recovery" / "flood.py"


def _kill(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    process.wait(timeout=30)


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
        deadline = time.monotonic() + 180
        while sweeper.status()["status"] != "ok":  # start-up poll (bounded)
            if process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(
                    f"the beat's sweeper never ran:\n{(folder / 'celery.log').read_text()[-3000:]}"
                )
            time.sleep(0.5)
        yield process
    finally:
        _kill(process)


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
            _kill(process)
