"""The one way tests and benchmarks stop a process they started: its process group, then reap it.

Every long-lived process a test starts is the leader of a session of its own
(`start_new_session=True`), so SIGKILL to its group also ends what it started (a worker's pool, a
server's children) and never reaches the test runner."""

from __future__ import annotations

import os
import signal
import subprocess
from typing import Any

REAP_S = 30.0


def stop_group(
    process: subprocess.Popen[Any], *, first: signal.Signals | None = None, grace: float = REAP_S
) -> None:
    """Stop `process` and reap it. With `first` (SIGTERM for a warm shutdown, say) the process alone
    is asked first and given `grace` seconds; if it still runs then, its whole group is SIGKILLed."""
    if first is not None and process.poll() is None:
        process.send_signal(first)
        try:
            process.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            pass
    if process.poll() is None:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    process.wait(timeout=REAP_S)
