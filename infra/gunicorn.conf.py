"""gunicorn's settings for one web replica:

    gunicorn -c infra/gunicorn.conf.py controlplane.asgi:application

Uvicorn workers (ASGI: HTTP and websockets), `WEB_CONCURRENCY` of them (default 2), on
`0.0.0.0:$PORT` (default 8000). Flags on the command line override these.

Shutdown: SIGTERM stops accepting, lets in-flight requests finish for up to
`GUNICORN_GRACEFUL_TIMEOUT` seconds (default 30), then exits; a balancer's health check
(`/readyz`) stops sending to a replica as soon as it stops answering.

Metrics: every worker writes its counters to files in `PROMETHEUS_MULTIPROC_DIR`, which
`/metrics` adds up, so a scrape counts every worker whichever one answers it. The folder is this
replica's own: a fresh one under the temporary folder unless the variable names one (emptied at
start; never share one folder between replicas, or each would report the others' counts too).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

worker_class = "uvicorn.workers.UvicornWorker"
bind = [f"0.0.0.0:{os.environ.get('PORT', '8000')}"]
workers = int(os.environ.get("WEB_CONCURRENCY", "2"))
graceful_timeout = int(os.environ.get("GUNICORN_GRACEFUL_TIMEOUT", "30"))
# The proxy in front (nginx) sets X-Forwarded-For / -Proto; trust them from it only.
forwarded_allow_ips = os.environ.get("FORWARDED_ALLOW_IPS", "127.0.0.1")
# gunicorn's control socket sits at one fixed path in the home folder: replicas on one machine
# would take it from each other. Signals (TERM, HUP, TTIN/TTOU) do its work here.
control_socket_disable = True
# Idle keep-alive connections from the balancer stay open longer than the balancer keeps them
# (nginx's upstream keepalive_timeout, 60 s in infra/cluster.sh). gunicorn's default (2 s) let a
# replica close a connection just as nginx reused it: a reset nginx counts as the replica failing,
# so a healthy replica was skipped and, with the other one draining, clients saw 502.
keepalive = int(os.environ.get("GUNICORN_KEEPALIVE", "75"))


def on_starting(server: Any) -> None:
    """In the master, before any worker exists (and so before prometheus-client is imported)."""
    folder = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if folder:
        path = Path(folder)
        if path.exists():
            for stale in path.glob("*.db"):
                stale.unlink()
        path.mkdir(parents=True, exist_ok=True)
    else:
        folder = tempfile.mkdtemp(prefix="sagaplane-metrics-")
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = folder
        server._sagaplane_metrics_dir = folder  # removed at exit: nobody else knows it


def child_exit(server: Any, worker: Any) -> None:
    """A worker is gone: its live gauges go (its counters stay counted)."""
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)


def on_exit(server: Any) -> None:
    folder = getattr(server, "_sagaplane_metrics_dir", None)
    if folder:
        shutil.rmtree(folder, ignore_errors=True)
