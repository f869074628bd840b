"""Redis dies while the control plane serves: ingest still answers the 200 its commit earned.

The live event and the integration request that follow a commit are best effort; before this
was fixed the post-commit hook's failure turned a stored batch into a 500, and the agent resent
records the server already held."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.hostile.production import Chain, control_plane, own_database, own_redis
from tests.support.production_env import production_env

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow]


def test_ingest_answers_200_after_redis_is_sigkilled(tmp_path: Path) -> None:
    with own_redis(tmp_path) as redis_server, own_database() as database:
        env = production_env(database.url, redis_server.url, tmp_path)
        with control_plane(env, workers=1) as server, server.client(timeout=30) as client:
            chain = Chain("agent-redis-down")
            first = client.post(f"/api/v1/streams/{chain.stream}/records", json={"records": chain.saga()})
            assert first.status_code == 200, first.text

            redis_server.kill()

            batch = chain.saga()
            second = client.post(f"/api/v1/streams/{chain.stream}/records", json={"records": batch})
            assert second.status_code == 200, f"{second.status_code} {second.text}\n{server.log_tail()}"
            assert second.json()["accepted"] == len(batch)
            assert second.json()["head"] == {"seq": chain.seq, "hash": chain.head}

            # Stored, not merely answered: the stream's head is the last record, and resending the
            # batch (what a client does after a 5xx) finds every record already there.
            head = client.get(f"/api/v1/streams/{chain.stream}")
            assert head.status_code == 200, head.text
            assert head.json()["head"] == {"seq": chain.seq, "hash": chain.head}
            again = client.post(f"/api/v1/streams/{chain.stream}/records", json={"records": batch})
            assert again.status_code == 200, again.text
            assert (again.json()["accepted"], again.json()["duplicates"]) == (0, len(batch))


def test_probes_answer_plain_http_and_name_only_the_failing_component(tmp_path: Path) -> None:
    import httpx

    with own_redis(tmp_path) as redis_server, own_database() as database:
        env = production_env(database.url, redis_server.url, tmp_path)
        with control_plane(env, workers=1) as server, httpx.Client(base_url=server.url, timeout=30) as plain:
            # An in-cluster probe: plain http, no proxy header. The probes answer; the rest redirects.
            assert plain.get("/healthz").status_code == 200
            ready = plain.get("/readyz")
            assert ready.status_code == 200, ready.text
            assert plain.get("/api/v1/sagas").status_code == 301

            redis_server.kill()

            ready = plain.get("/readyz")
            assert ready.status_code == 503, ready.text
            body = ready.json()
            assert "redis" in body["failing"] and body["checks"]["database"] == "ok"
            assert set(body["checks"].values()) <= {"ok", "error"}
            port = redis_server.url.rsplit(":", 1)[1].split("/")[0]
            assert "127.0.0.1" not in ready.text and port not in ready.text
