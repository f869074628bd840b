"""A local HTTP server that speaks Slack's Web API wire format, for tests with no network.

The control plane talks to it exactly as to Slack (`WebClient(base_url=SLACK_API_URL)`): every
method is `POST /api/<method>` with a form, JSON or query parameters and `Authorization: Bearer`
(or Basic client credentials for `oauth.v2.access`), answered `{"ok": true, ...}` or
`{"ok": false, "error": ...}` with HTTP 200, as Slack does. It also plays the consent page
(`GET /oauth/v2/authorize`: a page naming the app and the workspace, with "Allow", which
redirects back with a one-time code as Slack does, and "Cancel", which redirects back with
`error=access_denied`) and response URLs (`POST /hooks/...`). Every call is recorded, in order.

It also signs requests the way Slack signs what it sends to the app (`sign`), so tests can play
Slack's side of `/slack/...`.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import html
import itertools
import json
import secrets
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

from tests.support.waiting import wait_until


def _opened(event: threading.Event) -> threading.Event:
    event.set()
    return event


@dataclass
class Call:
    method: str
    params: dict[str, Any]
    token: str | None


@dataclass
class Message:
    channel: str
    ts: str
    text: str
    blocks: list[dict[str, Any]]
    updates: int = 0


@dataclass
class FakeSlack:
    """The workspace: one team, its people, its channels, the app's credentials."""

    client_id: str = "1111.2222"
    client_secret: str = "fake-client-secret"
    signing_secret: str = "fake-signing-secret"
    team_id: str = "T0ACME"
    team_name: str = "Acme Workspace"
    app_id: str = "A0SAGA"
    bot_user_id: str = "U0BOT"
    installer: str = "U0OWNER"
    channels: dict[str, str] = field(
        default_factory=lambda: {"C0RISK": "risk-approvals", "C0GENERAL": "general"}
    )
    users: dict[str, dict[str, Any]] = field(default_factory=dict)  # Slack user id → users.info's user
    calls: list[Call] = field(default_factory=list)
    messages: dict[tuple[str, str], Message] = field(default_factory=dict)
    codes: dict[str, str] = field(default_factory=dict)  # one-time code → redirect_uri
    tokens: dict[str, str] = field(default_factory=dict)  # live bot token → team id
    lock: threading.Lock = field(default_factory=threading.Lock)
    # Response URLs answer only once this is set (cleared by a test to hold them: what waits on
    # Slack then waits visibly).
    hooks_open: threading.Event = field(default_factory=lambda: _opened(threading.Event()))
    _ts: Any = field(default_factory=lambda: itertools.count(1))
    url: str = ""

    # -- what the tests read ------------------------------------------------------------------

    def called(self, method: str) -> list[Call]:
        with self.lock:
            return [c for c in self.calls if c.method == method]

    def wait_for(self, method: str, count: int = 1, timeout: float = 20.0) -> list[Call]:
        """The calls of `method` once there are at least `count` (polled, with a deadline)."""

        def enough() -> list[Call]:
            found = self.called(method)
            return found if len(found) >= count else []

        return wait_until(
            enough,
            f"{count} calls of {method}",
            deadline=timeout,
            every=0.02,
            context=lambda: f"{method} called {len(self.called(method))} times",
        )

    def channel_messages(self, channel: str) -> list[Message]:
        with self.lock:
            return [m for (c, _), m in sorted(self.messages.items()) if c == channel]

    # -- Slack's side of /slack/... -------------------------------------------------------------

    def sign(self, body: bytes, timestamp: int | None = None, secret: str | None = None) -> dict[str, str]:
        """The headers Slack sends with `body` (v0 signature over "v0:<ts>:<body>")."""
        ts = str(int(time.time()) if timestamp is None else timestamp)
        base = b"v0:" + ts.encode() + b":" + body
        digest = hmac.new((secret or self.signing_secret).encode(), base, hashlib.sha256).hexdigest()
        return {"HTTP_X_SLACK_REQUEST_TIMESTAMP": ts, "HTTP_X_SLACK_SIGNATURE": f"v0={digest}"}

    # -- the Web API ----------------------------------------------------------------------------

    def _answer(
        self, method: str, params: dict[str, Any], token: str | None, basic: tuple[str, str] | None
    ) -> dict:
        with self.lock:
            self.calls.append(Call(method, params, token))
        if method == "oauth.v2.access":
            client = basic or (params.get("client_id"), params.get("client_secret"))
            if client != (self.client_id, self.client_secret):
                return {"ok": False, "error": "invalid_client_id"}
            with self.lock:
                redirect = self.codes.pop(str(params.get("code")), None)
            if redirect is None:
                return {"ok": False, "error": "invalid_code"}
            if params.get("redirect_uri") and params["redirect_uri"] != redirect:
                return {"ok": False, "error": "bad_redirect_uri"}
            token = f"xoxb-{secrets.token_hex(12)}"
            with self.lock:
                self.tokens[token] = self.team_id
            return {
                "ok": True,
                "app_id": self.app_id,
                "authed_user": {"id": self.installer},
                "scope": "chat:write,chat:write.public,commands,channels:read,users:read,users:read.email",
                "token_type": "bot",
                "access_token": token,
                "bot_user_id": self.bot_user_id,
                "team": {"id": self.team_id, "name": self.team_name},
                "enterprise": None,
                "is_enterprise_install": False,
            }
        credentials = (params.get("client_id"), params.get("client_secret"))
        if method == "apps.uninstall" and credentials != (self.client_id, self.client_secret):
            return {"ok": False, "error": "invalid_client_id"}
        if token not in self.tokens:
            return {"ok": False, "error": "invalid_auth" if token else "not_authed"}
        if method == "auth.test":
            return {
                "ok": True,
                "url": f"https://{self.team_name.lower().replace(' ', '')}.slack.com/",
                "team": self.team_name,
                "user": "sagaplane",
                "team_id": self.team_id,
                "user_id": self.bot_user_id,
                "bot_id": "B0SAGA",
            }
        if method == "apps.uninstall":
            with self.lock:
                self.tokens.pop(token, None)
            return {"ok": True}
        if method == "conversations.list":
            channels = [{"id": cid, "name": name, "is_channel": True} for cid, name in self.channels.items()]
            return {"ok": True, "channels": channels, "response_metadata": {"next_cursor": ""}}
        if method == "users.info":
            user = self.users.get(str(params.get("user")))
            return {"ok": True, "user": user} if user else {"ok": False, "error": "user_not_found"}
        channel = str(params.get("channel", ""))
        if (
            method in ("chat.postMessage", "chat.update", "chat.postEphemeral")
            and channel not in self.channels
        ):
            return {"ok": False, "error": "channel_not_found"}
        blocks = params.get("blocks") or []
        if isinstance(blocks, str):
            blocks = json.loads(blocks)
        if method == "chat.postMessage":
            ts = f"{int(time.time())}.{next(self._ts):06d}"
            if not params.get("thread_ts"):  # a thread's replies are not the channel's messages
                with self.lock:
                    self.messages[(channel, ts)] = Message(channel, ts, str(params.get("text", "")), blocks)
            return {
                "ok": True,
                "channel": channel,
                "ts": ts,
                "message": {"text": params.get("text"), "blocks": blocks},
            }
        if method == "chat.update":
            with self.lock:
                message = self.messages.get((channel, str(params.get("ts"))))
                if message is None:
                    return {"ok": False, "error": "message_not_found"}
                message.text, message.blocks = str(params.get("text", "")), blocks
                message.updates += 1
            return {"ok": True, "channel": channel, "ts": message.ts, "text": message.text}
        if method == "chat.postEphemeral":
            return {"ok": True, "message_ts": f"{int(time.time())}.{next(self._ts):06d}"}
        return {"ok": False, "error": "unknown_method"}


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def _reply(
        self, status: int, body: bytes, content_type: str = "application/json; charset=utf-8", **headers: str
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        parts = urlsplit(self.path)
        query = {k: v[0] for k, v in parse_qs(parts.query).items()}
        slack = self.server.slack
        if parts.path == "/oauth/v2/authorize":
            with slack.lock:
                slack.calls.append(Call("oauth/v2/authorize", query, None))
            if query.get("client_id") != slack.client_id or not query.get("redirect_uri"):
                self._reply(400, b"bad request", "text/plain")
                return
            self._reply(200, _consent_page(slack, parts.query), "text/html; charset=utf-8")
            return
        if parts.path in ("/oauth/v2/authorize/allow", "/oauth/v2/authorize/cancel"):
            if query.get("client_id") != slack.client_id or not query.get("redirect_uri"):
                self._reply(400, b"bad request", "text/plain")
                return
            back = {"state": query.get("state", "")}
            if parts.path.endswith("/allow"):
                # The person clicked "Allow": back to the app with a one-time code and the state.
                code = secrets.token_hex(8)
                with slack.lock:
                    slack.codes[code] = query["redirect_uri"]
                back = {"code": code, **back}
            else:
                back = {"error": "access_denied", **back}
            self._reply(302, b"", "text/plain", Location=query["redirect_uri"] + "?" + urlencode(back))
            return
        if parts.path.startswith("/api/"):
            self._api(parts.path[5:], query)
            return
        self._reply(404, b"not found", "text/plain")

    def do_POST(self) -> None:
        parts = urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        kind = self.headers.get("Content-Type", "")
        params: dict[str, Any] = {k: v[0] for k, v in parse_qs(parts.query).items()}
        if kind.startswith("application/json"):
            params.update(json.loads(raw or b"{}"))
        elif raw:
            params.update({k: v[0] for k, v in parse_qs(raw.decode()).items()})
        if parts.path.startswith("/hooks/"):
            with self.server.slack.lock:
                self.server.slack.calls.append(Call("response_url", {"path": parts.path, **params}, None))
            self.server.slack.hooks_open.wait(timeout=60)
            self._reply(200, b"ok", "text/plain")
            return
        if parts.path.startswith("/api/"):
            self._api(parts.path[5:], params)
            return
        self._reply(404, b"not found", "text/plain")

    def _api(self, method: str, params: dict[str, Any]) -> None:
        auth = self.headers.get("Authorization", "")
        token = auth[7:] if auth.startswith("Bearer ") else params.pop("token", None)
        basic = None
        if auth.startswith("Basic "):
            user, _, password = base64.b64decode(auth[6:]).decode().partition(":")
            basic = (user, password)
        answer = self.server.slack._answer(method, params, token, basic)
        self._reply(200, json.dumps(answer).encode())


def _consent_page(slack: FakeSlack, query: str) -> bytes:
    """Slack's consent page, reduced to what a person sees and clicks."""
    same = html.escape(query, quote=True)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Slack: allow the app</title></head>
<body><h1 id="consent">Sagaplane is requesting permission to access the {html.escape(slack.team_name)} Slack
workspace</h1>
<p><a id="allow" href="/oauth/v2/authorize/allow?{same}">Allow</a>
<a id="cancel" href="/oauth/v2/authorize/cancel?{same}">Cancel</a></p></body></html>""".encode()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    slack: FakeSlack


def start(slack: FakeSlack) -> tuple[FakeSlack, _Server]:
    server = _Server(("127.0.0.1", 0), _Handler)
    server.slack = slack
    slack.url = f"http://127.0.0.1:{server.server_address[1]}"
    threading.Thread(target=server.serve_forever, name="fake-slack", daemon=True).start()
    return slack, server
