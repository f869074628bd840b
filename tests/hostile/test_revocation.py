"""Revocation is immediate in every process (issue 23, item 2), on the README's production command
with two workers and keep-alive clients: once `DELETE /api/v1/keys/<id>` has answered 204, no
request that starts afterwards is served with that key, whichever worker its connection landed
on, through the full stack or the lean paths (the gate's, the proofs'); once a member's role
change or removal has answered, no request of theirs that starts afterwards is served with what
they lost.

Before: each worker remembered a checked key for two seconds (and the gate's copy for up to one
when the tenant's epoch bump was lost), so 27-44 requests started after the 204 were answered 200."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from tests.hostile.production import (
    OWNER_PASSWORD,
    PROXY_HEADERS,
    ControlPlane,
    control_plane,
    manage,
    own_database,
    own_redis,
    sign_in,
)
from tests.support.production_env import production_env
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow]

CLIENTS = 8  # keep-alive connections, spread by the kernel over the two workers
AFTER = 15  # requests each client starts after the answer before the test looks
DEADLINE_S = 120.0
OWNER = "owner@hostile.example"
MEMBER = "member@hostile.example"
MEMBER_PASSWORD = "hostile-member-password"


@dataclass
class Sent:
    started: float
    what: str
    status: int
    body: str


@dataclass
class Load:
    """CLIENTS threads, each on its own keep-alive connection, repeating `requests` until stopped."""

    headers: dict[str, str]
    requests: list[tuple[str, str, dict[str, object] | None]]
    server: ControlPlane
    sent: list[Sent] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def run(self, n: int) -> None:
        try:
            with httpx.Client(
                base_url=self.server.url, headers={**PROXY_HEADERS, **self.headers}, timeout=60
            ) as c:
                while not self.stop.is_set():
                    for method, path, body in self.requests:
                        started = time.monotonic()
                        response = c.request(method, path, json=body)
                        with self.lock:
                            self.sent.append(
                                Sent(started, f"{n} {method} {path}", response.status_code, response.text)
                            )
        except BaseException as exc:  # reported by the test, not lost in a thread
            with self.lock:
                self.errors.append(exc)

    def started_after(self, moment: float) -> list[Sent]:
        with self.lock:
            return [s for s in self.sent if s.started > moment]

    def wait_for(self, condition: Callable[[], bool], what: str) -> None:
        def holds() -> bool:
            assert not self.errors, self.errors
            return condition()

        wait_until(holds, what, deadline=DEADLINE_S, context=lambda: self.sent[-5:])

    def across(self, change: Callable[[], None], served_after: Callable[[Sent], bool]) -> list[Sent]:
        """Run the load, make `change` once every client was served, and return what every client
        started after `change` had answered (at least AFTER each) that `served_after` calls served."""
        threads = [threading.Thread(target=self.run, args=(n,), daemon=True) for n in range(CLIENTS)]
        for thread in threads:
            thread.start()
        try:
            self.wait_for(
                lambda: len({s.what.split()[0] for s in self.sent if s.status == 200}) == CLIENTS,
                "all served",
            )
            change()
            answered = time.monotonic()
            self.wait_for(
                lambda: all(
                    sum(s.what.startswith(f"{n} ") for s in self.started_after(answered)) >= AFTER
                    for n in range(CLIENTS)
                ),
                f"{AFTER} requests per client after the answer",
            )
        finally:
            self.stop.set()
            for thread in threads:
                thread.join(timeout=DEADLINE_S)
        assert not self.errors, self.errors
        after = self.started_after(answered)
        assert len(after) >= CLIENTS * AFTER
        return [s for s in after if served_after(s)]


def _gate_call(n: int) -> dict[str, object]:
    return {"saga_id": "revocation-saga", "step_id": f"s{n}", "tool": "payments.refund", "args": {"n": n}}


def test_a_revoked_key_is_refused_by_every_worker_from_the_answer_on(tmp_path: Path) -> None:
    with own_redis(tmp_path) as redis_server, own_database() as database:
        env = production_env(database.url, redis_server.url, tmp_path)
        with control_plane(env, workers=2) as server:
            out = manage(
                env, "create_api_key", "--tenant", "hostile", "--name", "leaked", "--scopes", "gate,read"
            )
            raw = out.strip().splitlines()[-1]
            owner = sign_in(server, OWNER, OWNER_PASSWORD)
            with httpx.Client(base_url=server.url, headers={**PROXY_HEADERS, **owner}, timeout=60) as admin:
                keys = admin.get("/api/v1/keys").json()["results"]
                (key_id,) = [k["id"] for k in keys if k["name"] == "leaked"]

                def revoke() -> None:
                    response = admin.delete(f"/api/v1/keys/{key_id}")
                    assert response.status_code == 204, response.text

                load = Load(
                    {"Authorization": f"Bearer {raw}"},
                    [
                        ("POST", "/api/v1/gate/evaluate", _gate_call(1)),  # the lean gate path
                        ("GET", "/api/v1/tenant", None),  # the full stack
                        ("POST", "/api/v1/gate/evaluate", _gate_call(2)),
                        ("GET", "/api/v1/sagas", None),
                    ],
                    server,
                )
                served = load.across(revoke, lambda s: s.status != 401)
            assert served == [], f"{len(served)} served after the 204: {served[:5]}"
            refusals = {json.loads(s.body)["error"] for s in load.started_after(0) if s.status == 401}
            assert refusals == {"revoked_api_key"}


def _add_member(env: dict[str, str], role: str) -> None:
    script = (
        "from tenants import services; from tenants.actors import cli_actor; "
        "from tenants.entry import command_tenant\n"
        "with command_tenant('hostile') as tenant:\n"
        f"    services.add_member(tenant, {MEMBER!r}, {role!r}, {MEMBER_PASSWORD!r}, actor=cli_actor('test'))"
    )
    manage(env, "shell", "-c", script)


def _membership_id(admin: httpx.Client) -> int:
    members = admin.get("/api/v1/members").json()["results"]
    (found,) = [m["id"] for m in members if m["email"] == MEMBER]
    return int(found)


def _page_post(admin: httpx.Client, path: str, form: dict[str, str]) -> None:
    response = admin.post(path, data=form)
    assert response.status_code == 302, response.text
    assert not re.search(r"/login/", response.headers["location"])


def test_a_members_role_change_and_removal_hold_in_every_worker_from_the_answer_on(tmp_path: Path) -> None:
    with own_redis(tmp_path) as redis_server, own_database() as database:
        env = production_env(database.url, redis_server.url, tmp_path)
        with control_plane(env, workers=2) as server:
            _add_member(env, "admin")
            member = sign_in(server, MEMBER, MEMBER_PASSWORD)
            owner = sign_in(server, OWNER, OWNER_PASSWORD)
            with httpx.Client(base_url=server.url, headers={**PROXY_HEADERS, **owner}, timeout=60) as admin:
                membership = _membership_id(admin)

                # An admin may list the keys; once the change to viewer has answered, nowhere.
                load = Load(member, [("GET", "/api/v1/keys", None), ("GET", "/api/v1/tenant", None)], server)
                served = load.across(
                    lambda: _page_post(
                        admin, f"/administration/members/{membership}/role", {"role": "viewer"}
                    ),
                    lambda s: "/keys" in s.what and s.status != 403,
                )
                assert served == [], f"{len(served)} served as admin after the change: {served[:5]}"
                assert {s.status for s in load.started_after(0) if "/tenant" in s.what} == {200}

                # A member may read the tenant; once the removal has answered, nowhere.
                load = Load(member, [("GET", "/api/v1/tenant", None), ("GET", "/api/v1/sagas", None)], server)
                served = load.across(
                    lambda: _page_post(admin, f"/administration/members/{membership}/remove", {}),
                    lambda s: s.status != 404,
                )
                assert served == [], f"{len(served)} served as a member after the removal: {served[:5]}"
