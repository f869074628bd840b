"""What the browser tests share beyond conftest's fixtures: axe-core's accessibility pass, the
page's CSP violations as they are reported, and API calls as the live server's key."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx

from tests.e2e.conftest import LiveServer

AXE = Path(__file__).parent / "vendor" / "axe-core" / "axe.min.js"
SERIOUS = ("serious", "critical")
RUN_AXE = """async () => (await axe.run(document, {resultTypes: ["violations"]})).violations.map(
  v => ({id: v.id, impact: v.impact, nodes: v.nodes.map(n => n.target.join(" ")).slice(0, 3)}))"""
DEADLINE_S = 60.0


def csp_watched(page: Any) -> list[str]:
    """Every CSP violation the page reports on its console, collected as the test goes."""
    blocked: list[str] = []
    page.on("console", lambda m: blocked.append(m.text) if "Content Security Policy" in m.text else None)
    return blocked


def api_call(server: LiveServer, method: str, path: str, **kwargs: Any) -> httpx.Response:
    """A call of the API as the server's API key."""
    return httpx.request(
        method,
        f"{server.url}/api/v1/{path}",
        headers={"Authorization": f"Bearer {server.api_key}"},
        timeout=40,
        **kwargs,
    )


def claim_offered(server: LiveServer, handler: str) -> dict:
    """The next check offered to an observer of `handler` (the worker's beat offers it after the
    reconciliation delay), long-polled within a deadline."""
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        claimed = api_call(server, "POST", "reconciliation/claim", json={"handlers": [handler], "wait": 10})
        assert claimed.status_code == 200, claimed.text
        if claimed.json()["checks"]:
            check: dict = claimed.json()["checks"][0]
            return check
    raise AssertionError(f"no check for {handler} offered within {DEADLINE_S}s")
