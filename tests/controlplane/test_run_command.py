"""The README's first command really starts the control plane and serves the demo: run the same
script `make run` runs, in a fresh data folder, sign in as the demo owner, then stop it as a person
does (Ctrl-C) or a supervisor does (SIGTERM): every process it started is gone within seconds, none
of them killed (the server used to sit out its open long-polls, 25 s, and was killed at 10 s)."""

from __future__ import annotations

import os
import re
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.support.ports import free_port
from tests.support.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]


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


STOP_DEADLINE_S = 15.0  # the script's own bound is 10 s, after which it kills and says so


def _session_processes(session: int) -> dict[int, str]:
    """The live (not zombie) processes of a session: the script and everything it started."""
    found = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
            cmdline = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
        except OSError:
            continue  # exited meanwhile
        fields = text[text.rindex(")") + 2 :].split()  # after "pid (comm) "
        state, process_session = fields[0], int(fields[3])
        if process_session == session and state != "Z":
            found[int(stat.parent.name)] = cmdline
    return found


@dataclass
class Started:
    process: subprocess.Popen
    url: str
    credentials: str
    output: list[str]


def _start(tmp_path: Path) -> Started:
    port = free_port()
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
        # As from a terminal's shell: SIGINT at its default (a test run started in the background
        # inherits it ignored, and a shell cannot trap a signal ignored when it started).
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        line = _read_until(process, r"Sagaplane is running at", timeout=180)
        credentials = _read_until(process, r"Sign in as", timeout=10)
    except BaseException:
        _kill(process)
        raise
    # From here on the output is read by a thread (a full pipe would stall the server's logging).
    output: list[str] = []
    threading.Thread(target=lambda: output.extend(process.stdout), daemon=True).start()
    return Started(process, re.search(r"http://\S+?/", line).group(0), credentials, output)


def _kill(process: subprocess.Popen) -> None:
    """Clean-up only (the session: the script and all it started), after a failure."""
    for pid in _session_processes(process.pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    process.wait(timeout=10)


def _stops_cleanly(run: Started, stop: Callable[[], None]) -> None:
    """`stop()` ends every process the script started within STOP_DEADLINE_S, none killed."""
    process = run.process
    started = _session_processes(process.pid)
    commands = " ".join(started.values())
    for part in ("manage.py runserver", "celery -A controlplane worker", "demo_agent.py"):
        assert part in commands, (part, started)
    stop()
    try:
        wait_until(
            lambda: not _session_processes(process.pid),
            "every process the script started to stop after the signal",
            deadline=STOP_DEADLINE_S,
            every=0.1,
            context=lambda: f"still running: {_session_processes(process.pid)}",
        )
        process.wait(timeout=10)
        output = "".join(run.output)
        assert "did not stop" not in output, output[-3000:]
        assert process.returncode != 0  # stopped by a signal, as the shell reports it
    finally:
        if _session_processes(process.pid):
            _kill(process)


@pytest.mark.slow
def test_make_run_serves_the_demo_and_the_login_works_and_stops_on_sigterm(tmp_path: Path) -> None:
    run = _start(tmp_path)
    url, credentials = run.url, run.credentials
    try:
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
        seen: set[str] = set()

        def mcp_agent_shipped() -> bool:
            listing = httpx.get(url + "api/v1/sagas?limit=200", headers=headers, timeout=20).json()
            seen.update(s.get("agent") for s in listing["results"])
            return "mcp-shop-agent" in seen

        wait_until(
            mcp_agent_shipped, "a saga of the MCP demo agent", deadline=180, every=0.5, context=lambda: seen
        )
        _wait_for_the_demo_agent(tmp_path)
    except BaseException:
        _kill(run.process)
        raise
    # A supervisor's stop, as `make run` relays it: SIGTERM to the script, and once more while it
    # is stopping (make terminates its recipe's shell when it is terminated itself).
    _stops_cleanly(run, lambda: _terminate_twice(run.process))


def _terminate_twice(process: subprocess.Popen) -> None:
    """SIGTERM, then SIGTERM again once the script has begun stopping (its demo agents, stopped
    first, are gone): the second signal lands in the middle of the stop."""
    os.kill(process.pid, signal.SIGTERM)
    wait_until(
        lambda: not any("demo_agent.py" in c for c in _session_processes(process.pid).values()),
        "the demo agents to stop",
        deadline=STOP_DEADLINE_S,
    )
    if process.poll() is None:
        os.kill(process.pid, signal.SIGTERM)


@pytest.mark.slow
def test_make_run_stops_on_ctrl_c(tmp_path: Path) -> None:
    run = _start(tmp_path)
    try:
        _wait_for_the_demo_agent(tmp_path)
    except BaseException:
        _kill(run.process)
        raise
    # Ctrl-C in a terminal: SIGINT to the foreground process group, which the script leads here.
    _stops_cleanly(run, lambda: os.killpg(run.process.pid, signal.SIGINT))


def _wait_for_the_demo_agent(tmp_path: Path) -> None:
    """The demo agent is running and has shipped (it holds a fleet-status long-poll open from
    then on, which the server must give up when it stops)."""
    log = tmp_path / "data" / "demo-agent"
    wait_until(lambda: any(log.glob("*.cursor-*.json")), "the demo agent to ship", deadline=120)
