"""The production server started as the wrong database role fails closed (core/rls.py): run as
the owner role, which row-level security does not bind, it serves nothing but the probes, /readyz
names the problem, and the log says why."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.hostile.production import PROXY_HEADERS, control_plane, own_database, own_redis
from tests.support.production_env import production_env


@pytest.mark.slow
@pytest.mark.redis
@pytest.mark.postgres
def test_a_server_running_as_the_owner_role_serves_nothing(tmp_path: Path) -> None:
    with own_redis(tmp_path) as redis_server, own_database() as database:
        env = production_env(database.url, redis_server.url, tmp_path)
        as_owner = {**env, "DATABASE_URL": database.owner_url}
        with control_plane(env, workers=1, serve_env=as_owner) as server:
            plain = httpx.Client(base_url=server.url, headers=PROXY_HEADERS, timeout=30)
            assert plain.get("/healthz").status_code == 200
            ready = plain.get("/readyz")
            assert ready.status_code == 503 and ready.json()["failing"] == ["database_roles"], ready.text
            with server.client(timeout=30) as agent:
                refused = agent.get("/api/v1/sagas")
            assert refused.status_code == 503, refused.text
            assert refused.json()["error"] == "unsafe_database_role"
            assert "owns" not in refused.text  # the reasons are for the log
            log = server.log.read_text()
            assert "refusing to serve: unsafe database role" in log and "owns tenant tables" in log
