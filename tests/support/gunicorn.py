"""The README's production server as a child process: gunicorn with uvicorn workers on a free
loopback port, its output in `log`, up once `/healthz` answers, stopped warm (SIGTERM, then the
whole group killed) on leaving. The fault tests and the benchmarks share it."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from tests.support.ports import free_port
from tests.support.probes import healthy
from tests.support.processes import REAP_S, stop_group
from tests.support.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]


@contextmanager
def gunicorn(
    env: Mapping[str, str],
    log: Path,
    *,
    workers: int = 2,
    probe_headers: Mapping[str, str] | None = None,
    graceful_timeout_s: int = 5,
    config: Path | None = None,
    deadline: float = 120.0,
    stop_grace_s: float = REAP_S,
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """Serve `controlplane.asgi:application` with `workers` workers (and `config`, the production
    settings file, when given); yields the base URL and the gunicorn master."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    settings = ["-c", str(config)] if config is not None else []
    with log.open("w") as log_file:
        process = subprocess.Popen(
            [
                str(Path(sys.executable).parent / "gunicorn"),
                *settings,
                "controlplane.asgi:application",
                "-k",
                "uvicorn.workers.UvicornWorker",
                "--workers",
                str(workers),
                "--bind",
                f"127.0.0.1:{port}",
                "--graceful-timeout",
                str(graceful_timeout_s),
            ],
            cwd=ROOT,
            env=dict(env),
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_until(
            lambda: healthy(url, dict(probe_headers or {})),
            "the control plane to answer /healthz",
            deadline=deadline,
            alive=process,
            context=lambda: log.read_text(errors="replace")[-3000:],
        )
        yield url, process
    finally:
        stop_group(process, first=signal.SIGTERM, grace=stop_grace_s)
