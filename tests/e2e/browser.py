"""What the browser tests share beyond conftest's fixtures: the seeded people and their password,
the live server (its URL and API key) and calls of its API, signing in, screenshots, the console's
confirmation dialog, passkeys in a virtual authenticator, axe-core's accessibility pass, and the
page's CSP violations as they are reported. The fixtures (the server, the browser, its pages) are
in conftest.py."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = ROOT / "test-artifacts" / "screenshots"
PASSWORD = "sagaplane-demo"
OWNER = "owner@demo.sagaplane.local"
VIEWER = "viewer@demo.sagaplane.local"
AUDITOR = "auditor@demo.sagaplane.local"
CAROL = "carol@bravo.example"
RISK = "risk@demo.sagaplane.local"
LIVE_TIMEOUT = 15_000  # ms: a live update (websocket) reaching the page


@dataclass
class LiveServer:
    url: str
    api_key: str
    data_dir: Path
    log: Path

    def ship(self, stream: str, records: list[dict]) -> dict:
        response = httpx.post(
            f"{self.url}/api/v1/streams/{stream}/records",
            json={"records": records},
            headers={"Authorization": f"Bearer {self.api_key}"},
            timeout=20,
        )
        assert response.status_code == 200, response.text
        return response.json()


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


def sign_in(page, email: str, password: str = PASSWORD) -> None:  # type: ignore[no-untyped-def]
    from playwright.sync_api import expect

    page.goto("/login/")
    page.get_by_label("Email").fill(email)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Sign in", exact=True).click()
    expect(page.get_by_role("button", name="Sign out")).to_be_visible()


def screenshot(page, name: str) -> None:  # type: ignore[no-untyped-def]
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)


def wait_live(page) -> None:  # type: ignore[no-untyped-def]
    """The page's websocket is open (app.js marks <html data-live="open">)."""
    from playwright.sync_api import expect

    expect(page.locator("html")).to_have_attribute("data-live", "open", timeout=LIVE_TIMEOUT)


def localhost(server: LiveServer) -> str:
    return server.url.replace("127.0.0.1", "localhost")


def passkey_browser(browser_instance: Any, server: LiveServer) -> Any:
    """A browser context at http://localhost:<port> with a virtual platform authenticator."""
    context = browser_instance.new_context(
        base_url=localhost(server), viewport={"width": 1280, "height": 1100}
    )
    context.set_default_timeout(15_000)
    page = context.new_page()
    cdp = context.new_cdp_session(page)
    cdp.send("WebAuthn.enable")
    cdp.send(
        "WebAuthn.addVirtualAuthenticator",
        {
            "options": {
                "protocol": "ctap2",
                "transport": "internal",
                "hasResidentKey": True,
                "hasUserVerification": True,
                "isUserVerified": True,
                "automaticPresenceSimulation": True,
            }
        },
    )
    return context, page


def register_passkey(page: Any, name: str) -> None:
    from playwright.sync_api import expect

    page.goto("/account/passkeys/")
    page.get_by_label("Name").fill(name)
    page.get_by_role("button", name="Register passkey").click()
    expect(page.locator(f'#passkeys-table tr[data-passkey="{name}"]')).to_contain_text("active")


def confirm_dialog(page, text: str, *, action: str | None = None) -> None:  # type: ignore[no-untyped-def]
    """Answer the console's confirmation dialog (app.js): it is open, says `text` (and names
    `action` on its confirm button, when given), and its confirm button is clicked once."""
    from playwright.sync_api import expect

    dialog = page.locator("dialog#confirm-dialog")
    expect(dialog).to_be_visible()
    expect(dialog).to_contain_text(text)
    ok = dialog.locator("#confirm-dialog-ok")
    if action is not None:
        expect(ok).to_have_text(action)
    # The form is submitted as the dialog closes: wait for the server's answer to it, so that a
    # navigation the test starts next cannot cancel the submission on its way.
    with page.expect_response(lambda response: response.request.method == "POST"):
        ok.click()
    expect(dialog).to_be_hidden()
