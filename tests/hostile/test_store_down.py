"""Fail closed, fast: the gate while its Postgres or its Redis is down, and just after.

A deployment of the test's own (tests/recovery/live.py's private Postgres, initdb + pg_ctl on its
own port; a redis-server of its own; the production command serving), one process so every call
meets the same pools. Postgres is shut down by signalling its postmaster's PID (an immediate
shutdown: every connection cut), Redis is SIGKILLed, then each is started again on its port.
During each outage every gate call, on the lean ASGI path and through Django's view alike, and
the SDK's, is refused `503 control_plane_unavailable` in the error shape within a second (so is
any other API call while Postgres is down, the first to meet the outage included, and a console
page, in a real browser, is the 503 page); nothing is allowed; once the store is back the calls
are answered again without a multi-second first one.
(Measured on main before: 500 after the pool's 10 s timeout; 7.1 s for the first call after.)"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from sagaplane.gate import Call, Gate, GateDenied

from tests.e2e.browser import csp_watched
from tests.hostile.production import PROXY_HEADERS, OwnRedis, control_plane, manage, own_redis, pg_execute
from tests.recovery.live import Cluster, _roles, private_cluster
from tests.support.chromium import launched
from tests.support.probes import redis_answers
from tests.support.production_env import production_env
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow]

BOUND_S = 1.0  # the contract: a refusal within a second
RECOVERY_DEADLINE_S = 30.0  # for the store to come back (a start under load), not for any one call


@dataclass
class Stack:
    url: str
    key: str
    cluster: Cluster
    redis: OwnRedis
    owner_url: str


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp_path = tmp_path_factory.mktemp("store-down")
    runtime, owner = _roles()
    with private_cluster() as cluster, own_redis(tmp_path) as redis:
        cluster.execute(f"CREATE ROLE \"{runtime}\" LOGIN PASSWORD 'x' NOSUPERUSER NOBYPASSRLS")
        cluster.execute(f"CREATE ROLE \"{owner}\" LOGIN PASSWORD 'x' CREATEDB")
        cluster.execute(f'CREATE DATABASE sagaplane OWNER "{owner}"')
        data = tmp_path / "data"
        data.mkdir()
        env = production_env(
            f"postgres://{runtime}:x@127.0.0.1:{cluster.port}/sagaplane",
            redis.url,
            data,
            SECURE_SSL_REDIRECT="false",  # the SDK speaks plain http on loopback
        )
        with control_plane(env, workers=1, tenant="outage") as server:
            out = manage(
                env, "create_api_key", "--tenant", "outage", "--name", "agent", "--scopes", "gate,control"
            )
            key = out.strip().splitlines()[-1]
            with _client(server.url, key) as client:
                budget = {"name": "spend", "tool": "pay.*", "max_total": 10**9, "window_s": 3600}
                created = client.post("/api/v1/fleet/budgets", json=budget)
                assert created.status_code == 201, created.text
            owner_url = f"postgresql://{owner}:x@127.0.0.1:{cluster.port}/sagaplane"
            running = Stack(server.url, key, cluster, redis, owner_url)
            try:
                yield running
            finally:
                if running.redis is not redis and running.redis.process.poll() is None:
                    running.redis.kill()  # the one a test started again (own_redis ends the first)


def _client(url: str, key: str) -> httpx.Client:
    return httpx.Client(base_url=url, headers={**PROXY_HEADERS, "Authorization": f"Bearer {key}"}, timeout=30)


def _call(saga: str) -> dict[str, Any]:
    return {"saga_id": saga, "step_id": "1", "tool": "pay.charge", "args": {"amount": 1}}


def ask(client: httpx.Client, saga: str, *, django: bool = False) -> tuple[httpx.Response, float]:
    """One gate call, timed; `django`: with a query string, which the lean path hands to Django's
    view (controlplane/gate_asgi.py)."""
    path = "/api/v1/gate/evaluate" + ("?via=django" if django else "")
    started = time.monotonic()
    response = client.post(path, json=_call(saga))
    return response, time.monotonic() - started


def assert_refused_fast(client: httpx.Client, label: str) -> list[str]:
    """Calls on both paths during an outage: each 503 control_plane_unavailable, in the error
    shape, within the bound. Returns their saga ids."""
    sagas = []
    for n in range(8):
        saga = f"{label}-{n}-{uuid.uuid4().hex[:6]}"
        sagas.append(saga)
        response, took = ask(client, saga, django=n % 2 == 1)
        assert response.status_code == 503, (saga, response.status_code, response.text)
        body = response.json()
        assert body["error"] == "control_plane_unavailable" and body["detail"], body
        assert body["decision"] == "deny" and body["reason"] == "control_plane_unavailable", body
        assert response.headers["Retry-After"] == "1"
        assert took < BOUND_S, f"{saga}: refused after {took:.2f} s"
    return sagas


def assert_other_calls_refused_fast(client: httpx.Client) -> None:
    """Any other API call while the database is down: `503 control_plane_unavailable` with
    Retry-After, within the bound, and no gate decision in its body (none was asked for)."""
    for path in ("/api/v1/fleet/status", "/api/v1/sagas"):
        started = time.monotonic()
        response = client.get(path)
        took = time.monotonic() - started
        assert response.status_code == 503, (path, response.status_code, response.text)
        body = response.json()
        assert body["error"] == "control_plane_unavailable" and "decision" not in body, body
        assert response.headers["Retry-After"] == "1"
        assert took < BOUND_S, f"{path}: refused after {took:.2f} s"


def assert_back_without_a_slow_call(client: httpx.Client, label: str) -> float:
    """From the moment the store accepts connections again: calls until one is allowed, each one
    answered (refused or allowed) within the bound. Returns how long until the first allow."""
    started = time.monotonic()
    n = 0
    while True:
        n += 1
        response, took = ask(client, f"{label}-{n}", django=n % 2 == 0)
        assert took < BOUND_S, f"call {n} after the store came back took {took:.2f} s"
        if response.status_code == 200:
            assert response.json()["decision"] == "allow", response.text
            return time.monotonic() - started
        assert response.status_code == 503, response.text
        assert time.monotonic() - started < RECOVERY_DEADLINE_S, "the gate never answered again"


def allowed(stack: Stack, sagas: list[str]) -> int:
    rows = pg_execute(
        stack.owner_url,
        "SELECT count(*) FROM fleet_gatedecision WHERE decision = 'allow' AND saga_id = ANY(%s)",
        (sagas,),
    )
    return int(rows[0][0])


def warm(client: httpx.Client, label: str) -> None:
    """Calls until both paths answer from warm pools (the first call teaches the lean path)."""
    for n in range(4):
        response, _ = ask(client, f"{label}-warm-{n}", django=n % 2 == 1)
        assert response.status_code == 200 and response.json()["decision"] == "allow", response.text


def _postmaster_pid(cluster: Cluster) -> int:
    return int((cluster.data / "postmaster.pid").read_text().splitlines()[0])


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def stop_postgres(cluster: Cluster) -> None:
    """Immediate shutdown by the postmaster's PID (SIGQUIT: every backend goes at once, no
    checkpoint), waited for on the PID."""
    pid = _postmaster_pid(cluster)
    os.kill(pid, signal.SIGQUIT)
    wait_until(lambda: _gone(pid), "the private Postgres to stop")


def restart_redis(old: OwnRedis) -> OwnRedis:
    """A new, empty redis-server on the killed one's port and command line (a crash, a restart)."""
    process = subprocess.Popen(
        [str(arg) for arg in old.process.args],  # type: ignore[union-attr]
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    fresh = OwnRedis(old.url, process)
    wait_until(lambda: redis_answers(old.url), f"redis-server to start again on {old.url}", alive=process)
    return fresh


def test_postgres_down_every_gate_call_is_refused_fast_and_the_first_after_is_fast(stack: Stack) -> None:
    with _client(stack.url, stack.key) as client:
        warm(client, "pg")
        sdk = Gate(stack.url, stack.key, poll_wait=1.0).start()
        try:
            assert sdk.status()["ready"], sdk.status()
            stop_postgres(stack.cluster)
            refused = assert_refused_fast(client, "pg-down")
            assert_other_calls_refused_fast(client)
            with pytest.raises(GateDenied) as denied:
                sdk.check(Call("pg-down-sdk", "1", "pay.charge", "compensable", {"amount": 1}))
            assert denied.value.reason == "control_plane_unavailable", denied.value.answer
            stack.cluster.start()
            back_after = assert_back_without_a_slow_call(client, "pg-back")
        finally:
            sdk.close()
        assert allowed(stack, [*refused, "pg-down-sdk"]) == 0
        print(f"postgres: first allow {back_after:.2f} s after it accepted connections again")


def test_redis_down_every_gate_call_is_refused_fast_and_the_first_after_is_fast(stack: Stack) -> None:
    with _client(stack.url, stack.key) as client:
        warm(client, "redis")
        stack.redis.kill()
        refused = assert_refused_fast(client, "redis-down")
        stack.redis = restart_redis(stack.redis)
        back_after = assert_back_without_a_slow_call(client, "redis-back")
        assert allowed(stack, refused) == 0
        print(f"redis: first allow {back_after:.2f} s after it answered again (empty: rebuilt)")


def test_postgres_down_the_first_call_to_meet_it_is_refused_fast_whatever_it_asks(stack: Stack) -> None:
    """No gate call comes first to mark the database down: an API read meets the outage itself
    (a pooled connection that cannot be had: the pool's connection attempts are refused), then a
    console page does, in a browser under the production CSP."""
    with _client(stack.url, stack.key) as client, launched() as browser:
        page = _console_page(browser, stack.url)
        warm(client, "first")
        assert client.get("/api/v1/fleet/status").status_code == 200
        stop_postgres(stack.cluster)
        try:
            assert_other_calls_refused_fast(client)
            assert_console_page_refused_fast(page)
        finally:
            stack.cluster.start()
        assert_back_without_a_slow_call(client, "first-back")


def _console_page(browser: Any, url: str) -> Any:
    """A signed-in person's tab (a session cookie: the session is read from the database), its
    renderer already started (a browser's own start is not the server's answer)."""
    context = browser.new_context(base_url=url, extra_http_headers=PROXY_HEADERS)
    context.add_cookies([{"name": "sessionid", "value": uuid.uuid4().hex, "url": url}])
    page = context.new_page()
    assert page.goto("/healthz").status == 200
    return page


def assert_console_page_refused_fast(page: Any) -> None:
    """A page during the outage: the console's 503 page, asking to retry, answered within the
    bound (from the request sent to the answer's first byte) and without a CSP violation."""
    blocked = csp_watched(page)
    response = page.goto("/sagas/")
    assert response is not None and response.status == 503, response and response.status
    assert response.headers["retry-after"] == "1"
    heading = page.get_by_role("heading", name="The control plane is unavailable just now")
    assert heading.is_visible(), page.content()[:2000]
    assert "cannot reach its database" in page.inner_text("body")
    timing = response.request.timing
    took = (timing["responseStart"] - timing["requestStart"]) / 1000
    assert took < BOUND_S, f"the console page was refused after {took:.2f} s"
    assert blocked == [], blocked
