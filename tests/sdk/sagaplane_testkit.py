"""Shared helpers for the SDK tests: a control-plane test double speaking the ingest contract."""

from __future__ import annotations

import json
import re
import textwrap
import threading
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from agent_saga import integrity
from sagaplane.walfile import read_all

API_KEY = "sk_test_key"
_PATH = re.compile(r"^/api/v1/streams/([^/]+)/records$")
_STREAM_PATH = re.compile(r"^/api/v1/streams/([^/]+)$")


class FakeControlPlane:
    """Verifies each batch against the stream head (with agent-saga's verifier, so the
    SDK's own chain code is not checking itself), stores records once, and can be told
    to answer the next requests with scripted failures."""

    def __init__(self) -> None:
        self.streams: dict[str, list[dict[str, Any]]] = {}
        self.requests: list[dict[str, Any]] = []  # every POST: stream, count, status
        self.head_reads: list[str] = []  # every GET of a stream's head: the stream
        self.traceparents: list[str] = []  # every POST's W3C traceparent header ("" when none)
        self.readable = True  # False: GET of a stream answers 403 (a key without the read scope)
        self.scripted: deque[tuple[int, dict[str, Any], dict[str, str]]] = deque()
        self.max_records: int | None = None  # answer 413 above this
        self.lock = threading.Lock()
        self.got_request = threading.Condition(self.lock)
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802
                self.answer(*outer.head(self.path, self.headers.get("Authorization", "")), {})

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("Content-Length", 0))
                raw = self.rfile.read(length)
                outer.traceparents.append(self.headers.get("traceparent", ""))
                self.answer(*outer.handle(self.path, self.headers.get("Authorization", ""), raw))

            def answer(self, status: int, body: dict[str, Any], headers: dict[str, str]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def head(self, path: str, auth: str) -> tuple[int, dict[str, Any]]:
        """GET /api/v1/streams/<id>: the stream's head and length, as the control plane answers.
        GET /api/v1/fleet/status: no halts, nothing governed (the SDK's gate asks it)."""
        if path.split("?")[0] == "/api/v1/fleet/status":
            return 200, {"halts": [], "governed_tools": [], "version": "fake"}
        match = _STREAM_PATH.match(path)
        with self.lock:
            if not match:
                return 404, {"error": "not_found", "detail": "no such route"}
            stream = match.group(1)
            self.head_reads.append(stream)
            if auth != f"Bearer {API_KEY}":
                return 401, {"error": "invalid_api_key", "detail": "unknown key"}
            if not self.readable:
                return 403, {"error": "missing_scope", "detail": "this API key lacks the 'read' scope"}
            stored = self.streams.get(stream)
            if not stored:
                return 404, {"error": "not_found", "detail": "no such stream"}
            last = stored[-1]
            return 200, {
                "stream": stream,
                "head": {"seq": last.get("seq"), "hash": last.get("_h")},
                "length": len(stored),
            }

    def handle(self, path: str, auth: str, raw: bytes) -> tuple[int, dict[str, Any], dict[str, str]]:
        with self.lock:
            try:
                return self._handle(path, auth, raw)
            finally:
                self.got_request.notify_all()

    def _handle(self, path: str, auth: str, raw: bytes) -> tuple[int, dict[str, Any], dict[str, str]]:
        match = _PATH.match(path)
        if not match:
            return 404, {"error": "not_found"}, {}
        stream = match.group(1)
        records = json.loads(raw)["records"]
        entry: dict[str, Any] = {"stream": stream, "count": len(records)}
        self.requests.append(entry)
        if auth != f"Bearer {API_KEY}":
            entry["status"] = 401
            return 401, {"error": "invalid_api_key"}, {}
        if self.scripted:
            status, body, headers = self.scripted.popleft()
            entry["status"] = status
            return status, body, headers
        if self.max_records is not None and len(records) > self.max_records:
            entry["status"] = 413
            return 413, {"error": "too_large"}, {}
        stored = self.streams.setdefault(stream, [])
        known = {r["_h"] for r in stored}
        fresh = [r for r in records if r.get("_h") not in known]
        duplicates = len(records) - len(fresh)
        # agent-saga's verifier expects a whole log (seq from 1), so check the stream as it would be.
        report = integrity.verify(stored + fresh)
        head = stored[-1]["_h"] if stored else integrity.GENESIS
        linked = not fresh or fresh[0].get("_ph") == head
        if report.intact and not linked:
            entry["status"] = 422
            body = {"error": "chain_broken", "seq": fresh[0].get("seq"), "index": records.index(fresh[0])}
            body.update(reason="broken_link", expected=head, found=fresh[0].get("_ph"))
            return 422, body, {}
        if not report.intact:
            first = report.breaks[0] if report.breaks else None
            entry["status"] = 422
            return (
                422,
                {
                    "error": "chain_broken",
                    "seq": first.seq if first else fresh[0].get("seq"),
                    "index": first.index - len(stored) if first else 0,
                    "reason": first.reason if first else "does not link to the stream head",
                },
                {},
            )
        stored.extend(fresh)
        entry["status"] = 200
        last = stored[-1] if stored else {}
        return (
            200,
            {
                "stream": stream,
                "accepted": len(fresh),
                "duplicates": duplicates,
                "head": {"seq": last.get("seq"), "hash": last.get("_h")},
            },
            {},
        )

    def script(
        self, *responses: tuple[int, dict[str, Any]] | tuple[int, dict[str, Any], dict[str, str]]
    ) -> None:
        with self.lock:
            for r in responses:
                self.scripted.append((r[0], r[1], r[2] if len(r) > 2 else {}))  # type: ignore[misc]

    def records(self, stream: str) -> list[dict[str, Any]]:
        with self.lock:
            return list(self.streams.get(stream, []))

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def read_wal(path: Any) -> list[dict[str, Any]]:
    """Every record of the WAL at `path`, its sealed segments first (the SDK's own reader)."""
    entries, _ = read_all(path)
    return [entry.record for entry in entries if entry.record is not None]


# The head of a child agent that crash tests SIGKILL: two COMPENSABLE tools, the second of which
# lands its real-world effect (a file), tells the parent through a pipe (b"E") and hangs before
# returning, so the parent kills it between the effect and the commit record. The test appends
# the sagas to run. argv: WAL path, effect path, pipe fd.
CRASHING_AGENT_PRELUDE = textwrap.dedent(
    """
    import os, sys, threading
    import sagaplane as sp

    wal_path, effect_path, signal_fd = sys.argv[1], sys.argv[2], int(sys.argv[3])

    @sp.compensator("crash.refund")
    def refund(charge_id, idempotency_key=None):
        pass

    def charge(amount):
        with open(effect_path, "w") as fh:      # the real-world effect lands...
            fh.write(f"charged {amount}")
        os.write(signal_fd, b"E")               # ...tell the parent, then hang before returning
        threading.Event().wait()

    ok = sp.tool(lambda amount: {"id": f"ch_{amount}"}, name="charge_ok", semantics=sp.COMPENSABLE,
                 compensate=lambda r: sp.undo("crash.refund", charge_id=r["id"]))
    doomed = sp.tool(charge, semantics=sp.COMPENSABLE,
                     compensate=lambda r: sp.undo("crash.refund", charge_id=r["id"]))
    """
)
