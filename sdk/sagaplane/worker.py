"""A recovery worker: runs the compensations of sagas whose agent died, on any machine.

    import sagaplane as sp

    @sp.compensator("shop.refund")
    def refund(charge_id, idempotency_key=None): ...

    sp.Worker().run()          # or: sagaplane worker --handlers myapp.compensators

The worker long-polls `POST /api/v1/recovery/claim` for a job whose handler it has registered
(`@sp.compensator`), runs it with the compensation's kwargs and its `idempotency_key` (when the
handler accepts one), and reports `.../complete` or `.../fail` with the job's fencing token. The
control plane refuses a result whose token is stale (the job was claimed again after this worker's
lease ran out): such a worker's result is never recorded, and the handler's idempotency key is
what keeps the effect single when a compensation had to be run twice. While a handler runs, the
lease is renewed every third of its length.
"""

from __future__ import annotations

import inspect
import logging
import os
import random
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .client import Client, Response, TransportError
from .semantics import accepts_kwarg, registered_compensators, resolve_compensator

logger = logging.getLogger("sagaplane.worker")

CLAIM_PATH = "/api/v1/recovery/claim"
DEFAULT_LEASE_S = 30.0
DEFAULT_WAIT_S = 20.0


@dataclass
class Outcome:
    """What became of one claimed job, as the worker saw it."""

    job_id: str
    handler: str
    ok: bool
    recorded: bool  # the control plane accepted the result (false: stale token, or unreachable)
    error: str = ""


class Worker:
    """Claims and runs recovery jobs for the compensators registered in this process (or those
    in `handlers`: name → callable)."""

    def __init__(
        self,
        client: Client | None = None,
        *,
        handlers: dict[str, Callable[..., Any]] | None = None,
        name: str | None = None,
        lease_s: float = DEFAULT_LEASE_S,
        wait_s: float = DEFAULT_WAIT_S,
    ) -> None:
        self.client = client or Client(timeout=max(30.0, wait_s + 10.0))
        self._handlers = handlers
        self.name = name or f"{socket.gethostname()}:{os.getpid()}"
        self.lease_s = lease_s
        self.wait_s = wait_s
        self._stop = threading.Event()
        self.outcomes: list[Outcome] = []

    def handler_names(self) -> list[str]:
        return sorted(self._handlers) if self._handlers is not None else list(registered_compensators())

    def _resolve(self, name: str) -> Callable[..., Any] | None:
        if self._handlers is not None:
            return self._handlers.get(name)
        return resolve_compensator(name)

    def stop(self) -> None:
        """Finish the job in hand (if any) and return from `run`."""
        self._stop.set()

    # -- the loop ---------------------------------------------------------------------------

    def claim(self, wait_s: float | None = None) -> dict[str, Any] | None:
        names = self.handler_names()
        if not names:
            raise RuntimeError("no compensators registered: import your @sp.compensator module first")
        response = self.client.post(
            CLAIM_PATH,
            {
                "handlers": names,
                "worker": self.name,
                "lease_s": self.lease_s,
                "wait": self.wait_s if wait_s is None else wait_s,
            },
        )
        self.client.check_auth(response)
        if not response.ok:
            raise TransportError(f"claim refused: HTTP {response.status} {response.error_code}")
        job = response.body.get("job") if isinstance(response.body, dict) else None
        return job if isinstance(job, dict) else None

    def run_once(self, wait_s: float | None = None) -> Outcome | None:
        """Claim one job (waiting up to `wait_s`), run it and report it. None when none came."""
        job = self.claim(wait_s)
        if job is None:
            return None
        outcome = self.execute(job)
        self.outcomes.append(outcome)
        return outcome

    def run(self, *, max_jobs: int | None = None) -> int:
        """Until `stop()` (or `max_jobs` done): returns how many jobs it ran."""
        done = 0
        pause = 0.5
        while not self._stop.is_set() and (max_jobs is None or done < max_jobs):
            try:
                outcome = self.run_once()
            except TransportError as exc:
                logger.warning("recovery worker: %s; retrying in %.1fs", exc, pause)
                self._stop.wait(pause * (0.5 + random.random()))
                pause = min(pause * 2, 30.0)
                continue
            pause = 0.5
            if outcome is not None:
                done += 1
        return done

    # -- one job -----------------------------------------------------------------------------

    def _job_path(self, job: dict[str, Any], what: str) -> str:
        return f"/api/v1/recovery/jobs/{urllib.parse.quote(str(job['id']), safe='')}/{what}"

    def execute(self, job: dict[str, Any]) -> Outcome:
        handler = str(job.get("handler") or "")
        fn = self._resolve(handler)
        if fn is None:  # claimed only for registered names, so only if the registry changed since
            return self._report(
                job, "fail", {"error": f"no handler {handler!r} here", "reason": "no_handler"}
            )
        kwargs = dict(job.get("kwargs") or {})
        if accepts_kwarg(fn, "idempotency_key"):
            kwargs.setdefault("idempotency_key", job.get("idempotency_key"))
        beat = _Heartbeat(self, job)
        beat.start()
        try:
            result = fn(**kwargs)
            if inspect.isawaitable(result):
                from .saga import _run_coro

                _run_coro(result)
        except Exception as exc:
            beat.stop()
            logger.warning("compensation %s for step %s failed: %r", handler, job.get("step_id"), exc)
            return self._report(job, "fail", {"error": repr(exc)[:2000]})
        beat.stop()
        return self._report(job, "complete", {})

    def _report(self, job: dict[str, Any], what: str, body: dict[str, Any]) -> Outcome:
        """Send the result with the job's token, retrying while the control plane is unreachable."""
        body = {**body, "token": job["token"]}
        pause = 0.2
        deadline = time.monotonic() + max(60.0, self.lease_s * 2)
        while True:
            try:
                response = self.client.post(self._job_path(job, what), body)
                if response.status < 500 and response.status != 429:
                    break
                problem = f"HTTP {response.status} {response.error_code}"
            except TransportError as exc:
                problem = str(exc)
            # Unreachable, or failing (a database restarting): the result is retried with the same
            # token; if the lease runs out meanwhile, the job is run again under the same
            # idempotency key and this result is refused.
            if time.monotonic() > deadline:
                logger.error("could not report job %s: %s (its lease will run out)", job["id"], problem)
                return Outcome(str(job["id"]), str(job.get("handler")), what == "complete", False, problem)
            time.sleep(pause)
            pause = min(pause * 2, 5.0)
        return self._outcome(job, what, body, response)

    @staticmethod
    def _outcome(job: dict[str, Any], what: str, body: dict[str, Any], response: Response) -> Outcome:
        if response.status == 409:
            logger.warning(
                "job %s was claimed again after this worker's lease ran out: its result was not recorded",
                job["id"],
            )
        elif not response.ok:
            logger.error("reporting job %s: HTTP %s %s", job["id"], response.status, response.error_code)
        return Outcome(
            str(job["id"]),
            str(job.get("handler")),
            what == "complete",
            response.ok,
            str(body.get("error", "")),
        )


class _Heartbeat:
    """Renews a job's lease every third of its length while its handler runs."""

    def __init__(self, worker: Worker, job: dict[str, Any]) -> None:
        self.worker = worker
        self.job = job
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="sagaplane-job-heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._done.set()
        self._thread.join(timeout=5)

    def _loop(self) -> None:
        interval = max(0.2, self.worker.lease_s / 3)
        while not self._done.wait(interval):
            try:
                response = self.worker.client.post(
                    self.worker._job_path(self.job, "heartbeat"),
                    {"token": self.job["token"], "lease_s": self.worker.lease_s},
                )
            except TransportError:
                continue
            if response.status == 409:
                logger.warning("job %s: lease lost while its handler runs", self.job["id"])
                return
