"""Reconciliation: observers that check, after the fact, whether a compensated effect is really
reversed in the outside world, and the command-line gates built on their verdicts.

    import sagaplane as sp

    @sp.reconciler("shop.refund")            # the compensation handler it observes
    def refund_landed(charge_id, idempotency_key=None):
        entry = ledger.find_refund(charge_id)
        if entry is None:
            return False                       # drift: the "compensated" refund is not there
        return True                            # confirmed; None: cannot tell (unverifiable)

    sp.ReconcileWorker().run()               # or: sagaplane reconcile-worker --handlers myapp.observers

The worker long-polls `POST /api/v1/reconciliation/claim` for checks of the handlers it observes,
calls the observer with the compensation's kwargs (and its `idempotency_key` when the observer
accepts one), and answers with each check's fencing token, the answers of one claim together in
`POST /api/v1/reconciliation/answers` (one `.../checks/<id>/report` each from an older control
plane): true is `confirmed`, false is `drift`, None (or anything that is not a bool, or an
exception) is `unverifiable`. Nothing is ever assumed fine: a check no observer answers before its
deadline is unverifiable too.

`sagaplane reconcile --since T` exits 0 only when every compensated effect in the range is
confirmed, 1 when any drifted, 3 when none drifted but any is unverifiable or still pending
(drift wins: it is the worse news and needs a person first). `sagaplane certify --since T` fetches
the signed certificate, verifies it (offline with `--file` and `--key`) and exits 1 when it names
exceptions.
"""

from __future__ import annotations

import argparse
import inspect
import json
import logging
import os
import re
import socket
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from .client import AuthenticationError, Backoff, Client, ConfigurationError, Response, TransportError
from .semantics import accepts_kwarg, import_handler_modules

logger = logging.getLogger("sagaplane.reconcile")

CLAIM_PATH = "/api/v1/reconciliation/claim"
REPORT_PATH = "/api/v1/reconciliation/report"
ANSWERS_PATH = "/api/v1/reconciliation/answers"
CERTIFICATE_PATH = "/api/v1/audit/certificate"
KEY_PATH = "/api/v1/audit/key"
DEFAULT_WAIT_S = 20.0
MAX_TEXT_BYTES = 64 * 1024 * 1024

EXIT_OK = 0
EXIT_DRIFT = 1  # `reconcile`: an effect drifted; `certify`: the certificate names exceptions
EXIT_USAGE = 2
EXIT_UNVERIFIABLE = 3  # `reconcile`: no drift, but something could not be confirmed (yet)
EXIT_UNAVAILABLE = 4  # the control plane could not be asked, or the certificate does not verify

_OBSERVERS: dict[str, Callable[..., Any]] = {}


def reconciler(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register an observer for the compensation handler `name`: called with the compensation's
    kwargs, it returns True (the effect is reversed), False (it is not: drift) or None (cannot
    tell)."""

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        existing = _OBSERVERS.get(name)
        if existing is not None and existing is not fn and _qualname(existing) != _qualname(fn):
            raise ValueError(f"reconciler {name!r} is already registered to {_qualname(existing)}")
        _OBSERVERS[name] = fn
        return fn

    return decorate


def registered_reconcilers() -> tuple[str, ...]:
    return tuple(sorted(_OBSERVERS))


def resolve_reconciler(name: str) -> Callable[..., Any] | None:
    return _OBSERVERS.get(name)


def _qualname(fn: Callable[..., Any]) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


@dataclass
class Observation:
    """One check as this worker answered it."""

    check_id: str
    handler: str
    reversed: bool | None
    recorded: bool  # the control plane took the answer (false: stale token, or unreachable)
    status: str = ""  # the verdict the control plane recorded
    detail: str = ""


class ReconcileWorker:
    """Claims and answers reconciliation checks for the observers registered in this process (or
    those in `observers`: handler name → callable)."""

    def __init__(
        self,
        client: Client | None = None,
        *,
        observers: dict[str, Callable[..., Any]] | None = None,
        name: str | None = None,
        wait_s: float = DEFAULT_WAIT_S,
    ) -> None:
        self.client = client or Client(timeout=max(30.0, wait_s + 10.0))
        self._observers = observers
        self.name = name or f"{socket.gethostname()}:{os.getpid()}"
        self.wait_s = wait_s
        self._stop = threading.Event()
        self._single = False
        self.observations: list[Observation] = []

    def handler_names(self) -> list[str]:
        return sorted(self._observers) if self._observers is not None else list(registered_reconcilers())

    def _resolve(self, name: str) -> Callable[..., Any] | None:
        if self._observers is not None:
            return self._observers.get(name)
        return resolve_reconciler(name)

    def stop(self) -> None:
        self._stop.set()

    def claim(self, wait_s: float | None = None) -> list[dict[str, Any]]:
        names = self.handler_names()
        if not names:
            raise RuntimeError("no reconcilers registered: import your @sp.reconciler module first")
        response = self.client.post(
            CLAIM_PATH,
            {"handlers": names, "worker": self.name, "wait": self.wait_s if wait_s is None else wait_s},
        )
        self.client.check_auth(response)
        if not response.ok:
            raise TransportError(f"claim refused: HTTP {response.status} {response.error_code}")
        checks = response.body.get("checks") if isinstance(response.body, dict) else None
        return [c for c in checks or [] if isinstance(c, dict)]

    def run_once(self, wait_s: float | None = None) -> list[Observation]:
        """Claim what is due (waiting up to `wait_s` for something), observe each check, and send
        the answers together (`POST /api/v1/reconciliation/answers`: one transaction)."""
        answered = [(check, *self._answer(check)) for check in self.claim(wait_s)]
        done = self._report_all(answered)
        self.observations.extend(done)
        return done

    def run(self, *, max_checks: int | None = None) -> int:
        """Until `stop()` (or `max_checks` answered): returns how many checks it answered."""
        answered = 0
        backoff = Backoff(self._stop, logger, "reconcile worker")
        while not self._stop.is_set() and (max_checks is None or answered < max_checks):
            try:
                answered += len(self.run_once())
            except TransportError as exc:
                backoff.wait(exc)
                continue
            backoff.reset()
        return answered

    def observe(self, check: dict[str, Any]) -> Observation:
        """Observe one check and report its answer on its own."""
        return self._report(check, *self._answer(check))

    def _answer(self, check: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """Run the check's observer: its handler name and the answer's body."""
        handler = str(check.get("handler") or "")
        fn = self._resolve(handler)
        error = False
        detail = ""
        answer: bool | None = None
        if fn is None:  # claimed only for registered names, so only if the registry changed since
            error, detail = True, f"no reconciler {handler!r} here"
        else:
            kwargs = dict(check.get("kwargs") or {})
            if accepts_kwarg(fn, "idempotency_key"):
                kwargs.setdefault("idempotency_key", check.get("idempotency_key"))
            try:
                result = fn(**kwargs)
                if inspect.isawaitable(result):
                    from .context import run_coro

                    result = run_coro(result)
            except Exception as exc:
                error, detail = True, f"observer raised {exc!r}"[:500]
                logger.warning("reconciler %s for step %s failed: %r", handler, check.get("step_id"), exc)
            else:
                if result is True or result is False:
                    answer = result
                elif result is not None:
                    detail = f"observer returned {type(result).__name__}, not True/False/None"
        body = {"token": check.get("token"), "reversed": answer, "detail": detail, "error": error}
        return handler, body

    def _report_all(self, answered: list[tuple[dict[str, Any], str, dict[str, Any]]]) -> list[Observation]:
        """Send several answers in one request; a control plane without the batch route gets
        each on its own route. A transport failure is retried for a minute, as one answer is."""
        if len(answered) < 2 or self._single:
            return [self._report(check, handler, body) for check, handler, body in answered]
        items = [{"id": str(check.get("id")), **body} for check, _, body in answered]
        pause = 0.2
        deadline = time.monotonic() + 60.0
        while True:
            try:
                response = self.client.post(ANSWERS_PATH, {"answers": items})
                break
            except TransportError as exc:
                if time.monotonic() > deadline:
                    logger.error("could not report %d checks: %s", len(items), exc)
                    return [
                        Observation(str(check.get("id")), handler, body["reversed"], False, "", str(exc))
                        for check, handler, body in answered
                    ]
                time.sleep(pause)
                pause = min(pause * 2, 5.0)
        verdicts = response.body.get("answers") if isinstance(response.body, dict) else None
        if response.status == 404 and verdicts is None:
            self._single = True  # an older control plane: one answer per request
            return [self._report(check, handler, body) for check, handler, body in answered]
        if not response.ok or not isinstance(verdicts, list) or len(verdicts) != len(answered):
            logger.error("reporting %d checks: HTTP %s %s", len(items), response.status, response.error_code)
            return [
                Observation(str(check.get("id")), handler, body["reversed"], False, "", body["detail"])
                for check, handler, body in answered
            ]
        done = []
        for (check, handler, body), verdict in zip(answered, verdicts, strict=True):
            verdict = verdict if isinstance(verdict, dict) else {"error": "malformed"}
            if verdict.get("error"):
                logger.warning("check %s: %s", check.get("id"), verdict.get("error"))
            done.append(
                Observation(
                    str(check.get("id")),
                    handler,
                    body["reversed"],
                    not verdict.get("error"),
                    str(verdict.get("status", "")),
                    body["detail"],
                )
            )
        return done

    def _report(self, check: dict[str, Any], handler: str, body: dict[str, Any]) -> Observation:
        path = f"/api/v1/reconciliation/checks/{urllib.parse.quote(str(check.get('id')), safe='')}/report"
        pause = 0.2
        deadline = time.monotonic() + 60.0
        while True:
            try:
                response = self.client.post(path, body)
                break
            except TransportError as exc:
                if time.monotonic() > deadline:
                    logger.error("could not report check %s: %s", check.get("id"), exc)
                    return Observation(str(check.get("id")), handler, body["reversed"], False, "", str(exc))
                time.sleep(pause)
                pause = min(pause * 2, 5.0)
        status = response.body.get("status", "") if isinstance(response.body, dict) else ""
        if response.status == 409:
            logger.warning("check %s: %s", check.get("id"), response.error_code)
        elif not response.ok:
            logger.error(
                "reporting check %s: HTTP %s %s", check.get("id"), response.status, response.error_code
            )
        return Observation(
            str(check.get("id")), handler, body["reversed"], response.ok, str(status), body["detail"]
        )


# ------------------------------------------------------------------------------ the command line

_RELATIVE = re.compile(r"(\d{1,9})([smhd])")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def since_value(raw: str, now: datetime | None = None) -> str:
    """`--since` as the API takes it: relative (`90m`, `24h`, `7d`) becomes an ISO time; an ISO
    time or Unix seconds is passed as given (the control plane refuses what it cannot read)."""
    match = _RELATIVE.fullmatch(raw.strip())
    if match:
        moment = (now or datetime.now(UTC)) - timedelta(seconds=int(match[1]) * _UNIT[match[2]])
        return moment.isoformat().replace("+00:00", "Z")
    return raw.strip()


def _client(args: argparse.Namespace) -> Client:
    return Client(args.url, args.api_key)


def _add_connection(p: Any) -> None:
    p.add_argument("--url", help="control plane URL (default: $SAGAPLANE_URL)")
    p.add_argument("--api-key", help="API key (default: $SAGAPLANE_API_KEY)")


def _get(client: Client, path: str, query: dict[str, str]) -> Response:
    return client.get(f"{path}?{urllib.parse.urlencode(query)}")


def _get_text(client: Client, path: str, query: dict[str, str] | None = None) -> tuple[int, bytes]:
    """(status, body bytes) of a GET whose answer is text (the client's JSON reader keeps only
    the start of a text answer). Raises TransportError when the control plane cannot be reached."""
    import urllib.error
    import urllib.request

    url = client.url + path + (f"?{urllib.parse.urlencode(query)}" if query else "")
    headers = {"Authorization": f"Bearer {client.api_key}", "Accept": "text/plain, application/json"}
    request = urllib.request.Request(url, headers=headers, method="GET")
    try:
        with urllib.request.urlopen(request, timeout=client.timeout) as answer:
            return answer.status, answer.read(MAX_TEXT_BYTES + 1)
    except urllib.error.HTTPError as err:
        return err.code, err.read(64 * 1024)
    except (urllib.error.URLError, OSError) as exc:
        raise TransportError(f"GET {url}: {exc}") from exc


def _text_refused(status: int, body: bytes, what: str) -> int:
    try:
        parsed = json.loads(body)
    except ValueError:
        parsed = None
    return _refused(Response(status, parsed, {}), what)


def _refused(response: Response, what: str) -> int:
    body = response.body if isinstance(response.body, dict) else {}
    print(
        f"error: {what}: HTTP {response.status} {body.get('error', '')}: {body.get('detail', '')}",
        file=sys.stderr,
    )
    return EXIT_USAGE if response.status < 500 else EXIT_UNAVAILABLE


def add_reconcile(sub: Any) -> None:
    p = sub.add_parser(
        "reconcile",
        help="did every compensated effect since T really get reversed? exit 0 all confirmed, "
        "1 drift, 3 unverifiable or pending",
    )
    p.add_argument("--since", required=True, help="ISO 8601 time, Unix seconds, or relative: 90m, 24h, 7d")
    p.add_argument("--until", help="end of the range (default: now)")
    p.add_argument(
        "--wait", type=float, default=0.0, help="seconds to wait for pending checks to be answered"
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    _add_connection(p)
    p.set_defaults(func=cmd_reconcile)


def _exit_for(outcome: str) -> int:
    return {"confirmed": EXIT_OK, "drift": EXIT_DRIFT}.get(outcome, EXIT_UNVERIFIABLE)


def cmd_reconcile(args: argparse.Namespace) -> int:
    try:
        client = _client(args)
    except ConfigurationError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    query = {"since": since_value(args.since)}
    if args.until:
        query["until"] = since_value(args.until)
    deadline = time.monotonic() + max(0.0, args.wait)
    while True:
        try:
            response = _get(client, REPORT_PATH, query)
        except TransportError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_UNAVAILABLE
        if not response.ok or not isinstance(response.body, dict):
            return _refused(response, "the reconciliation report")
        report = response.body
        pending = (report.get("counts") or {}).get("pending", 0)
        if not pending or time.monotonic() >= deadline:
            break
        time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
    outcome = str(report.get("outcome"))
    if args.json:
        print(json.dumps(report, indent=2, sort_keys=True))
    else:
        counts = report.get("counts") or {}
        print(
            f"{outcome.upper()}: {sum(counts.values())} compensated effect(s) since {report.get('since')}: "
            + ", ".join(f"{counts.get(k, 0)} {k}" for k in ("confirmed", "drift", "unverifiable", "pending"))
        )
        for item in report.get("items") or []:
            if item.get("outcome") != "confirmed":
                print(
                    f"  {str(item.get('outcome')).upper():<13} saga {item.get('saga_id')} "
                    f"step {item.get('step_id')} "
                    f"{item.get('tool')} via {item.get('handler') or '(no handler)'}: {item.get('reason')}"
                    + (f" — {item.get('detail')}" if item.get("detail") else "")
                )
    return _exit_for(outcome)


def add_reconcile_worker(sub: Any) -> None:
    p = sub.add_parser(
        "reconcile-worker", help="answer reconciliation checks with your @sagaplane.reconciler observers"
    )
    p.add_argument(
        "--handlers",
        required=True,
        help="comma-separated modules to import; their @sagaplane.reconciler functions observe",
    )
    p.add_argument("--name", default=None, help="this worker's name in the evidence (default host:pid)")
    p.add_argument("--wait", type=float, default=DEFAULT_WAIT_S, help="seconds one claim waits (default 20)")
    p.add_argument("--max-checks", type=int, default=None, help="exit after answering this many checks")
    _add_connection(p)
    p.set_defaults(func=cmd_reconcile_worker)


def cmd_reconcile_worker(args: argparse.Namespace) -> int:
    import signal

    try:
        import_handler_modules(args.handlers)
    except ImportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        worker = ReconcileWorker(
            Client(args.url, args.api_key, timeout=max(30.0, args.wait + 10)),
            name=args.name,
            wait_s=args.wait,
        )
    except ConfigurationError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if not worker.handler_names():
        print("error: the --handlers modules register no @sagaplane.reconciler", file=sys.stderr)
        return EXIT_USAGE
    signal.signal(signal.SIGTERM, lambda *_: worker.stop())
    print(
        f"sagaplane reconcile-worker {worker.name}: observing {', '.join(worker.handler_names())}", flush=True
    )
    try:
        answered = worker.run(max_checks=args.max_checks)
    except AuthenticationError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        answered = len(worker.observations)
    print(f"answered {answered} check(s)", flush=True)
    return EXIT_OK


def add_certify(sub: Any) -> None:
    p = sub.add_parser(
        "certify",
        help="fetch (or read) the signed certificate for a range, verify it, exit 1 when it names exceptions",
    )
    p.add_argument("--since", help="ISO 8601 time, Unix seconds, or relative: 90m, 24h, 7d")
    p.add_argument("--until", help="end of the range (default: now)")
    p.add_argument("--file", help="verify this saved certificate offline instead of fetching one")
    p.add_argument("--out", help="save the fetched certificate here")
    p.add_argument(
        "--key",
        action="append",
        default=[],
        metavar="VERIFIER_KEY",
        help="the tenant's log verifier key (repeatable); required with --file; without it the keys the "
        "control plane serves are used",
    )
    _add_connection(p)
    p.set_defaults(func=cmd_certify)


def cmd_certify(args: argparse.Namespace) -> int:
    from .certificate import CertificateError, verify_certificate

    keys: list[str] = list(args.key)
    if args.file:
        if not keys:
            print("error: --file needs --key (an offline check needs the verifier key)", file=sys.stderr)
            return EXIT_USAGE
        try:
            with open(args.file, "rb") as fh:
                message = fh.read(MAX_TEXT_BYTES + 1)
        except OSError as exc:
            print(f"error: cannot read {args.file}: {exc}", file=sys.stderr)
            return EXIT_USAGE
        target = args.file
    else:
        if not args.since:
            print("error: --since is required unless --file is given", file=sys.stderr)
            return EXIT_USAGE
        try:
            client = _client(args)
            query = {"since": since_value(args.since)}
            if args.until:
                query["until"] = since_value(args.until)
            status, message = _get_text(client, CERTIFICATE_PATH, query)
            if status != 200:
                return _text_refused(status, message, "the certificate")
            if not keys:
                status, served = _get_text(client, KEY_PATH)
                if status != 200:
                    return _text_refused(status, served, "the verifier key")
                keys = [line for line in served.decode("utf-8", "replace").splitlines() if line.strip()]
                print(
                    "note: verified against the keys the control plane serves; pin one with --key",
                    file=sys.stderr,
                )
        except ConfigurationError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_USAGE
        except TransportError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_UNAVAILABLE
        if args.out:
            with open(args.out, "wb") as fh:
                fh.write(message)
        target = f"certificate since {query['since']}"
    try:
        cert = verify_certificate(message, keys)
    except CertificateError as exc:
        print(f"FAILED: {target}: {exc}")
        return EXIT_UNAVAILABLE
    if cert.clean:
        print(f"CLEAN: {target}: {cert.summary()}")
        return EXIT_OK
    print(f"EXCEPTIONS: {target}: {cert.summary()}")
    for e in cert.exceptions:
        print(
            f"  {str(e.get('reason')).upper():<20} saga {e.get('saga_id')} "
            f"step {e.get('step_id')} {e.get('tool')}"
        )
    return EXIT_DRIFT
