"""Talking to the control plane: configuration from the environment, JSON over kept-alive HTTP."""

from __future__ import annotations

import http.client
import json
import logging
import os
import random
import select
import socket
import threading
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

from ._version import __version__

ENV_URL = "SAGAPLANE_URL"
ENV_API_KEY = "SAGAPLANE_API_KEY"


class SagaplaneError(Exception):
    pass


class ConfigurationError(SagaplaneError):
    """The SDK was asked to reach the control plane without knowing where or as whom."""


class AuthenticationError(SagaplaneError):
    """The control plane refused the API key (401) or its scope (403)."""

    def __init__(self, status: int, code: str, detail: str = "") -> None:
        self.status = status
        self.code = code
        what = "rejected" if status == 401 else "not allowed to do this"
        super().__init__(
            f"API key {what} by the control plane (HTTP {status} {code}){': ' + detail if detail else ''}"
        )


class TransportError(SagaplaneError):
    """The control plane could not be reached (connection refused, DNS, timeout)."""


class Backoff:
    """A worker loop's wait after the control plane could not be reached: doubling from 0.5 s up
    to 30 s, jittered so that a fleet of workers does not come back in step; `reset` after an
    answer. `wait` returns early when `stop` is set."""

    def __init__(self, stop: threading.Event, logger: logging.Logger, what: str) -> None:
        self.stop, self.logger, self.what = stop, logger, what
        self.pause = 0.5

    def wait(self, exc: Exception) -> None:
        self.logger.warning("%s: %s; retrying in %.1fs", self.what, exc, self.pause)
        self.stop.wait(self.pause * (0.5 + random.random()))
        self.pause = min(self.pause * 2, 30.0)

    def reset(self) -> None:
        self.pause = 0.5


@dataclass(frozen=True)
class Response:
    status: int
    body: Any
    headers: dict[str, str]

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    @property
    def error_code(self) -> str:
        if isinstance(self.body, dict):
            return str(self.body.get("error") or self.body.get("detail") or "")
        return ""


# A kept-alive connection that fails like this before any answer was read was most likely closed by
# the server while idle (uvicorn closes idle connections after a few seconds).
_STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError, ConnectionAbortedError)
_IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS"})


class Client:
    """A minimal JSON client. Every non-2xx answer comes back as a Response, not an
    exception, so callers (the shipper) can decide what each status means; only a
    failure to reach the server raises (TransportError).

    Requests reuse one kept-alive HTTP connection per thread. A connection the server closed
    while idle is replaced before use; if a request still fails on a reused connection before
    any answer arrived, it is sent once more on a new connection, but only when sending it twice
    is harmless (idempotent methods, and record batches, which the server deduplicates by hash).
    With an HTTP proxy configured for the URL, each request goes through urllib instead."""

    def __init__(self, url: str | None = None, api_key: str | None = None, *, timeout: float = 30.0) -> None:
        url = url or os.environ.get(ENV_URL)
        api_key = api_key or os.environ.get(ENV_API_KEY)
        if not url:
            raise ConfigurationError(f"no control plane URL: pass url= or set {ENV_URL}")
        if not api_key:
            raise ConfigurationError(f"no API key: pass api_key= or set {ENV_API_KEY}")
        parsed = urllib.parse.urlparse(url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ConfigurationError(f"{ENV_URL} must be an http(s) URL, got {url!r}")
        self.url = url.rstrip("/")
        self.api_key = api_key
        self.timeout = timeout
        self._parsed = parsed
        self._prefix = parsed.path.rstrip("/")
        self._local = threading.local()
        self._headers = {
            "Authorization": f"Bearer {api_key}",
            "Content-Type": "application/json",
            "Accept": "application/json",
            "User-Agent": f"sagaplane-sdk/{__version__}",
        }
        proxies = urllib.request.getproxies()
        self._via_proxy = bool(proxies.get(parsed.scheme)) and not urllib.request.proxy_bypass(
            parsed.hostname or ""
        )
        self.connections_opened = 0  # new TCP connections (tests and metrics: keep-alive at work)

    # -- public API ----------------------------------------------------------------------------

    def request(self, method: str, path: str, body: Any = None) -> Response:
        data = None if body is None else json.dumps(body, ensure_ascii=False).encode("utf-8")
        return self.request_raw(method, path, data)

    def request_raw(
        self, method: str, path: str, data: bytes | None = None, *, idempotent: bool | None = None
    ) -> Response:
        """Send `data` (already-encoded JSON, or None) as is and wait for the answer."""
        return self.start(method, path, data, idempotent=idempotent).response()

    def start(
        self,
        method: str,
        path: str,
        data: bytes | None = None,
        *,
        idempotent: bool | None = None,
        headers: dict[str, str] | None = None,
    ) -> PendingRequest:
        """Send a request now and collect its answer later (`.response()`), so the caller can do
        other work while the server handles it. One pending request per thread at a time.
        `headers` are added to this request's (a batch's `traceparent`)."""
        if idempotent is None:
            idempotent = method in _IDEMPOTENT
        pending = PendingRequest(self, method, path, data, idempotent, headers)
        if not self._via_proxy:
            pending.send()
        return pending

    def post(self, path: str, body: Any) -> Response:
        return self.request("POST", path, body)

    def get(self, path: str) -> Response:
        return self.request("GET", path)

    def records_path(self, stream_id: str) -> str:
        return f"/api/v1/streams/{urllib.parse.quote(stream_id, safe='')}/records"

    def post_records(self, stream_id: str, records: list[dict[str, Any]]) -> Response:
        return self.post(self.records_path(stream_id), {"records": records})

    def start_records_raw(
        self, stream_id: str, body: bytes, *, headers: dict[str, str] | None = None
    ) -> PendingRequest:
        """POST an already-encoded `{"records": [...]}` body. Safe to resend: the server stores a
        record once and counts a resent one as a duplicate."""
        return self.start("POST", self.records_path(stream_id), body, idempotent=True, headers=headers)

    def stream(self, stream_id: str) -> Response:
        return self.get(f"/api/v1/streams/{urllib.parse.quote(stream_id, safe='')}")

    def check_auth(self, response: Response) -> None:
        """Turn a 401/403 into AuthenticationError: a wrong key is a configuration error, not a retry."""
        if response.status in (401, 403):
            raise AuthenticationError(response.status, response.error_code or "forbidden")

    def close(self) -> None:
        """Close this thread's kept-alive connection (the next request opens a new one)."""
        conn = getattr(self._local, "conn", None)
        self._local.conn = None
        if conn is not None:
            conn.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- connections ---------------------------------------------------------------------------

    def _connection(self) -> tuple[http.client.HTTPConnection, bool]:
        """This thread's connection and whether it was used before (so may have gone stale)."""
        conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
        if conn is not None and conn.sock is not None and _closed_by_peer(conn.sock):
            conn.close()
        if conn is None:
            host, port = self._parsed.hostname or "", self._parsed.port
            if self._parsed.scheme == "https":
                conn = http.client.HTTPSConnection(host, port, timeout=self.timeout)  # urllib's TLS defaults
            else:
                conn = http.client.HTTPConnection(host, port, timeout=self.timeout)
            self._local.conn = conn
        reused = conn.sock is not None
        if not reused:
            self.connections_opened += 1
        return conn, reused

    def _urllib(
        self, method: str, path: str, data: bytes | None, extra: dict[str, str] | None = None
    ) -> Response:
        headers = {**self._headers, **(extra or {})}
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                return Response(resp.status, _parse(resp.read()), dict(resp.headers.items()))
        except urllib.error.HTTPError as err:
            try:
                raw = err.read()
            except OSError:
                raw = b""
            return Response(err.code, _parse(raw), dict(err.headers.items()) if err.headers else {})
        except (urllib.error.URLError, OSError, TimeoutError) as exc:
            raise TransportError(f"{method} {self.url}{path}: {exc}") from exc


class PendingRequest:
    """A request on its way (`Client.start`); `response()` waits for the answer."""

    def __init__(
        self,
        client: Client,
        method: str,
        path: str,
        data: bytes | None,
        idempotent: bool,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.client = client
        self.method = method
        self.path = path
        self.data = data
        self.idempotent = idempotent
        self.extra_headers = headers or {}
        self._conn: http.client.HTTPConnection | None = None
        self._reused = False
        self._error: BaseException | None = None

    def _describe(self, exc: BaseException) -> TransportError:
        return TransportError(f"{self.method} {self.client.url}{self.path}: {exc!r}")

    def send(self) -> None:
        client = self.client
        conn, self._reused = client._connection()
        self._conn = conn
        headers = {**client._headers, **self.extra_headers}
        if self.data is None:
            headers.pop("Content-Type")
        try:
            conn.request(self.method, client._prefix + self.path, body=self.data, headers=headers)
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            self._error = exc  # reported (or retried) by response()

    def response(self) -> Response:
        client = self.client
        if client._via_proxy:
            return client._urllib(self.method, self.path, self.data, self.extra_headers)
        for attempt in (0, 1):
            conn = self._conn
            assert conn is not None
            try:
                if self._error is not None:
                    raise self._error
                resp = conn.getresponse()
                raw = resp.read()
                headers = dict(resp.getheaders())
                status = resp.status
                if resp.will_close:
                    conn.close()
                return Response(status, _parse(raw), headers)
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                stale = self._reused and isinstance(exc, _STALE)
                if attempt == 0 and stale and self.idempotent:
                    self._error = None
                    self.send()  # a new connection this time: not reused, so no third try
                    continue
                raise self._describe(exc) from exc
        raise AssertionError("unreachable")  # pragma: no cover


def _closed_by_peer(sock: socket.socket) -> bool:
    """An idle kept-alive socket that is readable has been closed by the server (or sent junk)."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)


def _parse(raw: bytes) -> Any:
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode("utf-8", "replace")[:2000]
