"""Talking to the control plane: configuration from the environment, JSON over urllib."""

from __future__ import annotations

import json
import os
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


class Client:
    """A minimal JSON client. Every non-2xx answer comes back as a Response, not an
    exception, so callers (the shipper) can decide what each status means; only a
    failure to reach the server raises (TransportError)."""

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

    def request(self, method: str, path: str, body: Any = None) -> Response:
        data = None if body is None else json.dumps(body, ensure_ascii=False).encode("utf-8")
        req = urllib.request.Request(
            self.url + path,
            data=data,
            method=method,
            headers={
                "Authorization": f"Bearer {self.api_key}",
                "Content-Type": "application/json",
                "Accept": "application/json",
                "User-Agent": f"sagaplane-sdk/{__version__}",
            },
        )
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

    def post(self, path: str, body: Any) -> Response:
        return self.request("POST", path, body)

    def get(self, path: str) -> Response:
        return self.request("GET", path)

    def post_records(self, stream_id: str, records: list[dict[str, Any]]) -> Response:
        return self.post(
            f"/api/v1/streams/{urllib.parse.quote(stream_id, safe='')}/records", {"records": records}
        )

    def stream(self, stream_id: str) -> Response:
        return self.get(f"/api/v1/streams/{urllib.parse.quote(stream_id, safe='')}")

    def check_auth(self, response: Response) -> None:
        """Turn a 401/403 into AuthenticationError: a wrong key is a configuration error, not a retry."""
        if response.status in (401, 403):
            raise AuthenticationError(response.status, response.error_code or "forbidden")


def _parse(raw: bytes) -> Any:
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode("utf-8", "replace")[:2000]
