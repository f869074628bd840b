"""Calls released together, each in a thread and database connection of its own (races in tests)."""

from __future__ import annotations

import json
import subprocess
import threading
from collections.abc import Callable, Iterable
from typing import Any

from django.db import connection


def at_once(call: Callable[[Any], Any], args: Iterable[Any], patience_s: float = 60.0) -> list[Any]:
    """`call(arg)` for every arg, each in its own thread (and database connection, closed after),
    all released together: what each returned or raised, in the order of `args`. Fails when a
    thread is still running after `patience_s` (a deadlock is a failure, not a hang)."""
    args = list(args)
    barrier = threading.Barrier(len(args))
    outcomes: list[Any] = [None] * len(args)

    def run(n: int) -> None:
        try:
            barrier.wait(patience_s)
            outcomes[n] = call(args[n])
        except BaseException as exc:  # handed to the test: a thread's exception is not a pass
            outcomes[n] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(n,)) for n in range(len(args))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(patience_s)
    assert not any(thread.is_alive() for thread in threads)
    return outcomes


def released_together(workers: list[subprocess.Popen[str]], deadline_s: float) -> list[Any]:
    """Worker processes released at one moment: each prints "ready", waits for a line on its
    stdin, then prints its JSON result as its last line. Returns each worker's result, in order;
    a worker that failed fails the test with its stderr. Any still running at the end is killed."""
    try:
        for worker in workers:
            assert worker.stdout is not None
            line = worker.stdout.readline()
            assert line.strip() == "ready", worker.stderr.read() if worker.stderr else line
        for worker in workers:
            assert worker.stdin is not None
            worker.stdin.write("go\n")
            worker.stdin.flush()
        results: list[Any] = []
        for worker in workers:
            out, err = worker.communicate(timeout=deadline_s)
            assert worker.returncode == 0, err[-3000:]
            results.append(json.loads(out.strip().splitlines()[-1]))
        return results
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
