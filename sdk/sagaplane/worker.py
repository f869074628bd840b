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

One job at a time, a job's result rides on the claim for the next one. With `concurrency=N`
(`--concurrency N`), `run` keeps up to N handlers running at once in a thread pool: each claim
asks for as many jobs as there are free slots (`max_jobs`) and carries the results finished
since the last one (each with its own token); what no claim carried within a moment one
reporting thread sends in batches (`POST /api/v1/recovery/results`), so a slow answer from the
control plane never holds a handler slot.
"""

from __future__ import annotations

import inspect
import logging
import os
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from .client import Backoff, Client, Response, TransportError
from .credentials import Resolved
from .semantics import accepts_kwarg, registered_compensators, resolve_compensator

logger = logging.getLogger("sagaplane.worker")

CLAIM_PATH = "/api/v1/recovery/claim"
RESULTS_PATH = "/api/v1/recovery/results"
DEFAULT_LEASE_S = 30.0
DEFAULT_WAIT_S = 20.0
MAX_CLAIM_BATCH = 100  # the control plane's limit on one claim's max_jobs
MAX_REPORT_BATCH = 500  # ... and on one results request
IDLE_CLAIM_S = 0.25  # with jobs in hand and none to claim: ask again after this, or sooner
PIGGYBACK_S = 0.05  # a pool's result waits this long for a claim to carry it, then goes alone


_Result = tuple[dict[str, Any], str, dict[str, Any]]
"""A finished job: the job as claimed, "complete" or "fail", and the body to report."""


def _result_item(job: dict[str, Any], what: str, body: dict[str, Any]) -> dict[str, Any]:
    """One result as the batch routes take it."""
    return {"id": str(job["id"]), "token": job["token"], "ok": what == "complete", **body}


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
        concurrency: int = 1,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency: at least 1")
        self.client = client or Client(timeout=max(30.0, wait_s + 10.0))
        self._handlers = handlers
        self.name = name or f"{socket.gethostname()}:{os.getpid()}"
        self.lease_s = lease_s
        self.wait_s = wait_s
        self.concurrency = concurrency
        self._stop = threading.Event()
        self._lock = threading.Lock()
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
        jobs = self.claim_many(1, wait_s)
        return jobs[0] if jobs else None

    def claim_many(self, max_jobs: int, wait_s: float | None = None) -> list[dict[str, Any]]:
        """Claim up to `max_jobs` jobs in one request (waiting up to `wait_s` for the first)."""
        jobs, _ = self._claim(max_jobs, wait_s, [])
        return jobs

    def _claim(
        self, max_jobs: int, wait_s: float | None, results: list[_Result]
    ) -> tuple[list[dict[str, Any]], list[Any] | None]:
        """Claim (as `claim_many`), sending `results` in the same request: the jobs, and the
        results' answers in order -- None when the control plane did not take them (an older one
        ignores the field; a refusal), so that they must be sent on their own."""
        names = self.handler_names()
        if not names:
            raise RuntimeError("no compensators registered: import your @sp.compensator module first")
        body: dict[str, Any] = {
            "handlers": names,
            "worker": self.name,
            "lease_s": self.lease_s,
            "wait": self.wait_s if wait_s is None else wait_s,
        }
        if max_jobs > 1:
            body["max_jobs"] = min(max_jobs, MAX_CLAIM_BATCH)
        if results:
            body["results"] = [_result_item(*result) for result in results]
        response = self.client.post(CLAIM_PATH, body)
        self.client.check_auth(response)
        if results and 400 <= response.status < 500 and response.status != 429:
            return [], None  # not recorded (a 4xx changes nothing): they go on their own route
        if not response.ok:
            raise TransportError(f"claim refused: HTTP {response.status} {response.error_code}")
        data = response.body if isinstance(response.body, dict) else {}
        answers = data.get("results")
        taken = answers if isinstance(answers, list) and len(answers) == len(results) else None
        jobs = data.get("jobs")
        if isinstance(jobs, list):
            return [job for job in jobs if isinstance(job, dict)], taken
        job = data.get("job")
        return ([job] if isinstance(job, dict) else []), taken

    def run_once(self, wait_s: float | None = None) -> Outcome | None:
        """Claim one job (waiting up to `wait_s`), run it and report it. None when none came."""
        job = self.claim(wait_s)
        if job is None:
            return None
        outcome = self.execute(job)
        self.outcomes.append(outcome)
        return outcome

    def run(self, *, max_jobs: int | None = None) -> int:
        """Until `stop()` (or `max_jobs` done): returns how many jobs it ran.

        One job at a time, a job's result rides on the claim for the next one (one request per
        job, not two); the control plane records it before it claims, so the older step it
        unlocks can come back in the same answer. A claim that fails is sent again with the same
        result (its token makes a repeat harmless); the last result goes on its own route."""
        if self.concurrency > 1:
            return self._run_pool(max_jobs)
        done = 0
        pending: list[_Result] = []
        backoff = Backoff(self._stop, logger, "recovery worker")
        try:
            while not self._stop.is_set() and (max_jobs is None or done < max_jobs):
                try:
                    jobs, answers = self._claim(1, None, pending)
                except TransportError as exc:
                    backoff.wait(exc)
                    continue
                backoff.reset()
                if answers is None:
                    self._report_alone(pending)
                else:
                    self._record_answers(pending, answers)
                pending = []
                if jobs:
                    pending = [self._run_job(jobs[0])]
                    done += 1
        finally:
            self._report_alone(pending)
        return done

    def _report_alone(self, results: list[_Result]) -> None:
        for job, what, body in results:
            self._record(self._report(job, what, body))

    def _record_answers(self, results: list[_Result], answers: list[Any]) -> None:
        """Each result's outcome from its answer on a batch route (`{"id", "state"}` or
        `{"id", "error", "detail"}`)."""
        for (job, what, body), answer in zip(results, answers, strict=True):
            code = str(answer.get("error") or "") if isinstance(answer, dict) else "malformed"
            status = {"": 200, "stale_token": 409, "not_found": 404}.get(code, 400)
            self._record(self._answered(job, what, body, status, code))

    def _run_pool(self, max_jobs: int | None) -> int:
        """Up to `concurrency` handlers at once; results reported in batches by one thread."""
        slots = threading.Condition()
        running = 0
        claimed = 0
        reporter = _Reporter(self)
        beats = _Heartbeats(self)
        reporter.start()
        beats.start()

        def one(job: dict[str, Any]) -> None:
            nonlocal running
            try:
                what, body = self._call(job)
            except BaseException as exc:  # never lose a slot or a result
                what, body = "fail", {"error": repr(exc)[:2000]}
            finally:
                beats.forget(job)
            reporter.put(job, what, body)
            with slots:
                running -= 1
                slots.notify_all()

        backoff = Backoff(self._stop, logger, "recovery worker")
        with ThreadPoolExecutor(self.concurrency, thread_name_prefix="sagaplane-compensator") as pool:
            try:
                while not self._stop.is_set() and (max_jobs is None or claimed < max_jobs):
                    with slots:
                        while running >= self.concurrency and not self._stop.is_set():
                            slots.wait(0.5)
                        free = self.concurrency - running
                    if self._stop.is_set():
                        break
                    if max_jobs is not None:
                        free = min(free, max_jobs - claimed)
                    busy = free < self.concurrency
                    # The results finished so far ride on this claim (recorded before it claims,
                    # so the older steps they unlock can come back in its answer); the reporter
                    # sends only what no claim carried within a moment.
                    results = reporter.take() if reporter.piggyback else []
                    try:
                        # With jobs in hand, ask without waiting: what becomes claimable next is
                        # mostly the older steps of the sagas this worker is compensating, which
                        # its own results unlock, so it asks again once one of its handlers has
                        # finished (or after a moment) instead of holding a long-poll open that
                        # re-runs the claim query on the server ten times a second.
                        jobs, answers = self._claim(free, 0 if busy else None, results)
                    except TransportError as exc:
                        reporter.give_back(results)
                        backoff.wait(exc)
                        continue
                    backoff.reset()
                    if results and answers is None:  # not taken: the reporter sends them
                        reporter.piggyback = False
                        reporter.give_back(results)
                    elif results:
                        self._record_answers(results, answers or [])
                    if not jobs and busy:
                        reporter.finished.wait(IDLE_CLAIM_S)
                        reporter.finished.clear()
                    for job in jobs[:free]:
                        with slots:
                            running += 1
                        claimed += 1
                        beats.track(job)
                        pool.submit(one, job)
            finally:
                pool.shutdown(wait=True)
                reporter.close()
                beats.close()
        return claimed

    # -- one job -----------------------------------------------------------------------------

    def _call(self, job: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """Run the job's handler: what to report and with which body."""
        handler = str(job.get("handler") or "")
        fn = self._resolve(handler)
        if fn is None:
            return "fail", {"error": f"no handler {handler!r} here", "reason": "no_handler"}
        kwargs = dict(job.get("kwargs") or {})
        if accepts_kwarg(fn, "idempotency_key"):
            kwargs.setdefault("idempotency_key", job.get("idempotency_key"))
        resolved = Resolved()  # the compensation's credential references, resolved for this call
        try:
            result = fn(**resolved.resolve(kwargs, markers=True))
            if inspect.isawaitable(result):
                from .context import run_coro

                run_coro(result)
        except Exception as exc:
            error = resolved.scrub(repr(exc))
            logger.warning("compensation %s for step %s failed: %s", handler, job.get("step_id"), error)
            return "fail", {"error": error[:2000]}
        return "complete", {}

    def _record(self, outcome: Outcome) -> None:
        with self._lock:
            self.outcomes.append(outcome)

    def _job_path(self, job: dict[str, Any], what: str) -> str:
        return f"/api/v1/recovery/jobs/{urllib.parse.quote(str(job['id']), safe='')}/{what}"

    def execute(self, job: dict[str, Any]) -> Outcome:
        return self._report(*self._run_job(job))

    def _run_job(self, job: dict[str, Any]) -> _Result:
        """Run one job's handler, its lease renewed meanwhile: what to report."""
        beat = _Heartbeat(self, job)
        beat.start()
        try:
            what, body = self._call(job)
        finally:
            beat.stop()
        return job, what, body

    def _report(self, job: dict[str, Any], what: str, body: dict[str, Any]) -> Outcome:
        """Send the result with the job's token, retrying while the control plane is unreachable."""
        body = {**body, "token": job["token"]}
        response, problem = self._post_answered(self._job_path(job, what), body)
        if response is None:
            logger.error("could not report job %s: %s (its lease will run out)", job["id"], problem)
            return Outcome(str(job["id"]), str(job.get("handler")), what == "complete", False, problem)
        return self._outcome(job, what, body, response)

    def _post_answered(self, path: str, body: dict[str, Any]) -> tuple[Response | None, str]:
        """POST a result until the control plane answers it (not 5xx, not 429), or None and the
        last problem once the deadline (two leases, at least a minute) has passed. Unreachable, or
        failing (a database restarting): the result is retried with the same token; if the lease
        runs out meanwhile, the job is run again under the same idempotency key and this result
        is refused."""
        pause = 0.2
        deadline = time.monotonic() + max(60.0, self.lease_s * 2)
        while True:
            try:
                response = self.client.post(path, body)
                if response.status < 500 and response.status != 429:
                    return response, ""
                problem = f"HTTP {response.status} {response.error_code}"
            except TransportError as exc:
                problem = str(exc)
            if time.monotonic() > deadline:
                return None, problem
            time.sleep(pause)
            pause = min(pause * 2, 5.0)

    @staticmethod
    def _outcome(job: dict[str, Any], what: str, body: dict[str, Any], response: Response) -> Outcome:
        return Worker._answered(job, what, body, response.status, response.error_code)

    @staticmethod
    def _answered(job: dict[str, Any], what: str, body: dict[str, Any], status: int, code: str) -> Outcome:
        if status == 409:
            logger.warning(
                "job %s was claimed again after this worker's lease ran out: its result was not recorded",
                job["id"],
            )
        elif not 200 <= status < 300:
            logger.error("reporting job %s: HTTP %s %s", job["id"], status, code)
        return Outcome(
            str(job["id"]),
            str(job.get("handler")),
            what == "complete",
            200 <= status < 300,
            str(body.get("error", "")),
        )


class _Reporter:
    """The pool's results. Each rides on the worker's next claim (`take`), which comes as soon as
    its handler's slot is free; what no claim carried within PIGGYBACK_S (the pool has nothing to
    claim, a control plane that does not take results on claims) one thread sends in batches
    (`POST /api/v1/recovery/results`). A batch the control plane cannot take yet (unreachable,
    5xx, 429) is sent again with the same tokens, until twice the lease (at least 60 s); a control
    plane without the batch route gets each result on its own route."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self._items: list[_Result] = []
        self._cond = threading.Condition()
        self._closing = False
        self._single = False
        self.piggyback = True  # results ride on claims (off once a claim did not take them)
        self.finished = threading.Event()  # set whenever a handler's result is put
        self._thread = threading.Thread(target=self._loop, name="sagaplane-results", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def put(self, job: dict[str, Any], what: str, body: dict[str, Any]) -> None:
        with self._cond:
            self._items.append((job, what, body))
            self._cond.notify_all()
        self.finished.set()

    def take(self) -> list[_Result]:
        """The results waiting (at most one request's worth), for a claim to carry."""
        with self._cond:
            taken = self._items[:MAX_REPORT_BATCH]
            del self._items[:MAX_REPORT_BATCH]
            return taken

    def give_back(self, results: list[_Result]) -> None:
        """Results a claim carried but could not have recorded: sent again (same tokens)."""
        if results:
            with self._cond:
                self._items[:0] = results
                self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._items and not self._closing:
                    self._cond.wait()
                if not self._items:
                    return  # closing, nothing left
                # A moment for the next claim to carry them (it comes when a slot frees), unless
                # claims no longer carry results.
                deadline = time.monotonic() + PIGGYBACK_S
                while (
                    self._items
                    and self.piggyback
                    and not self._closing
                    and (left := deadline - time.monotonic()) > 0
                ):
                    self._cond.wait(left)
                batch = self._items[:MAX_REPORT_BATCH]
                del self._items[:MAX_REPORT_BATCH]
            if batch:
                try:
                    self._send(batch)
                except Exception:  # a bug here must not strand the pool: log and go on
                    logger.exception("recovery worker: reporting %d results failed", len(batch))

    def _send(self, batch: list[_Result]) -> None:
        worker = self.worker
        if self._single:
            for job, what, body in batch:
                worker._record(worker._report(job, what, body))
            return
        items = [_result_item(job, what, body) for job, what, body in batch]
        response, problem = worker._post_answered(RESULTS_PATH, {"results": items})
        if response is None:
            logger.error("could not report %d jobs: %s (their leases will run out)", len(batch), problem)
            for job, what, _ in batch:
                failed = Outcome(str(job["id"]), str(job.get("handler")), what == "complete", False, problem)
                worker._record(failed)
            return
        answers = response.body.get("results") if isinstance(response.body, dict) else None
        if response.status == 404 and answers is None:
            self._single = True  # an older control plane: one result per request
            self._send(batch)
            return
        if not response.ok or not isinstance(answers, list) or len(answers) != len(batch):
            logger.error("reporting %d jobs: HTTP %s %s", len(batch), response.status, response.error_code)
            for job, what, body in batch:
                worker._record(worker._answered(job, what, body, response.status, response.error_code))
            return
        worker._record_answers(batch, answers)


class _Heartbeats:
    """One thread renewing the leases of every job the pool runs that has been running for a
    third of its lease (a long compensation)."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self._jobs: dict[str, tuple[dict[str, Any], float]] = {}
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="sagaplane-heartbeats", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def track(self, job: dict[str, Any]) -> None:
        with self._lock:
            self._jobs[str(job["id"])] = (job, time.monotonic())

    def forget(self, job: dict[str, Any]) -> None:
        with self._lock:
            self._jobs.pop(str(job["id"]), None)

    def close(self) -> None:
        self._done.set()
        self._thread.join(timeout=5)

    def _loop(self) -> None:
        interval = max(0.2, self.worker.lease_s / 3)
        while not self._done.wait(min(interval, 1.0)):
            now = time.monotonic()
            with self._lock:
                due = [(job, at) for job, at in self._jobs.values() if now - at >= interval]
            for job, _ in due:
                try:
                    response = self.worker.client.post(
                        self.worker._job_path(job, "heartbeat"),
                        {"token": job["token"], "lease_s": self.worker.lease_s},
                    )
                except TransportError:
                    continue
                with self._lock:
                    if str(job["id"]) not in self._jobs:
                        continue
                    if response.status == 409:
                        logger.warning("job %s: lease lost while its handler runs", job["id"])
                        self._jobs.pop(str(job["id"]), None)
                    else:
                        self._jobs[str(job["id"])] = (job, time.monotonic())


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
