"""The README's first command really starts the control plane and serves the demo: run the same
script `make run` runs, in a fresh data folder, sign in as the demo owner, then stop it."""

from __future__ import annotations

import os
import re
import selectors
import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _read_until(process: subprocess.Popen, pattern: str, timeout: float) -> str:
    """Read the process's output until a line matches; fail on exit or timeout."""
    selector = selectors.DefaultSelector()
    selector.register(process.stdout, selectors.EVENT_READ)
    seen = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not selector.select(timeout=deadline - time.monotonic()):
            break
        line = process.stdout.readline()
        if not line:
            break
        seen.append(line)
        if re.search(pattern, line):
            return line
    raise AssertionError(f"never printed {pattern!r}; output was:\n{''.join(seen)[-3000:]}")


@pytest.mark.slow
def test_make_run_serves_the_demo_and_the_login_works(tmp_path: Path) -> None:
    port = _free_port()
    env = {
        k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "DATABASE_OWNER_URL", "REDIS_URL")
    }
    env.update({"PORT": str(port), "SAGAPLANE_DATA_DIR": str(tmp_path / "data")})
    process = subprocess.Popen(
        ["bash", "infra/run-embedded.sh"],
        cwd=ROOT,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        line = _read_until(process, r"Sagaplane is running at", timeout=180)
        url = re.search(r"http://\S+?/", line).group(0)
        credentials = _read_until(process, r"Sign in as", timeout=10)
        assert "owner@demo.sagaplane.local" in credentials and "sagaplane-demo" in credentials
        with httpx.Client(base_url=url, follow_redirects=True, timeout=20) as client:
            assert client.get("/healthz").json()["status"] == "ok"
            login_page = client.get("/login/")
            csrf = client.cookies["csrftoken"]
            assert login_page.status_code == 200
            home = client.post(
                "/login/",
                data={
                    "username": "owner@demo.sagaplane.local",
                    "password": "sagaplane-demo",
                    "csrfmiddlewaretoken": csrf,
                    "next": "/",
                },
                headers={"Referer": url + "login/"},
            )
            assert home.status_code == 200
            assert "Demo Co" in home.text and "owner" in home.text
            assert "Content-Security-Policy" in home.headers
        # The second demo agent works through the MCP gateway: its sagas reach the control plane.
        key = (tmp_path / "data" / "demo_api_key").read_text().strip()
        headers = {"Authorization": f"Bearer {key}"}
        deadline = time.monotonic() + 180
        agents: set[str] = set()
        while "mcp-shop-agent" not in agents:
            assert time.monotonic() < deadline, f"no saga of the MCP demo agent; agents seen: {agents}"
            time.sleep(0.5)  # polling a condition with a deadline
            listing = httpx.get(url + "api/v1/sagas?limit=200", headers=headers, timeout=20).json()
            agents = {s.get("agent") for s in listing["results"]}
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
