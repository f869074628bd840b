"""A bounded loopback load test of the README's production command: Postgres connections stay
under the bound the configuration sets, and nothing answers 5xx.

Two gunicorn + uvicorn workers, each with a pool of DB_POOL_MAX_SIZE connections, serve more
concurrent clients than the pools have connections (ingest and reads mixed). Before the pool,
every request thread kept a connection of its own (CONN_MAX_AGE=60): 2 workers held 53 and
Postgres began refusing new ones, answering 500."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.hostile.production import Chain, ControlPlane, control_plane, own_database, own_redis
from tests.support.production_env import production_env

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow]

WORKERS = 2
POOL_SIZE = 4
# Connections to the database can never exceed what the pools may open: nothing else connects
# to it while the load runs (migrations and set-up finished; the watcher is in another database).
CONNECTION_BOUND = WORKERS * POOL_SIZE
CLIENTS = 3 * CONNECTION_BOUND  # well over the bound, so unpooled connections would show
ROUNDS = 6  # per client: one ingest, then three reads


class Load:
    def __init__(self, server: ControlPlane) -> None:
        self.server = server
        self.lock = threading.Lock()
        self.statuses: list[tuple[str, int]] = []
        self.errors: list[BaseException] = []
        self.in_flight = 0
        self.peak_in_flight = 0
        self.start = threading.Barrier(CLIENTS)
        self.chains = [Chain(f"load-agent-{n}") for n in range(CLIENTS)]

    def _request(self, client: httpx.Client, method: str, path: str, **kwargs: Any) -> httpx.Response:
        with self.lock:
            self.in_flight += 1
            self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        try:
            response = client.request(method, path, **kwargs)
        finally:
            with self.lock:
                self.in_flight -= 1
        with self.lock:
            self.statuses.append((f"{method} {path.split('/')[3]}", response.status_code))
        return response

    def client(self, chain: Chain) -> None:
        try:
            with self.server.client(timeout=120) as client:
                self.start.wait(timeout=120)
                for _ in range(ROUNDS):
                    records = chain.saga()
                    self._request(
                        client, "POST", f"/api/v1/streams/{chain.stream}/records", json={"records": records}
                    )
                    self._request(client, "GET", f"/api/v1/streams/{chain.stream}")
                    self._request(client, "GET", "/api/v1/sagas", params={"limit": 20})
                    self._request(client, "GET", f"/api/v1/sagas/{chain.sagas[-1]}")
        except BaseException as exc:  # reported by the test, not lost in a thread
            with self.lock:
                self.errors.append(exc)


def test_connections_stay_under_the_pool_bound_and_nothing_answers_5xx(tmp_path: Path) -> None:
    with own_redis(tmp_path) as redis_server, own_database() as database:
        env = production_env(database.url, redis_server.url, tmp_path, DB_POOL_MAX_SIZE=str(POOL_SIZE))
        with control_plane(env, workers=WORKERS) as server:
            load = Load(server)
            samples: list[int] = []
            done = threading.Event()

            def watch() -> None:
                while not done.is_set():
                    samples.append(database.connections())
                    done.wait(0.02)  # sampling pace, not synchronisation: the load ends by join()

            watcher = threading.Thread(target=watch)
            watcher.start()
            clients = [threading.Thread(target=load.client, args=(chain,)) for chain in load.chains]
            try:
                for thread in clients:
                    thread.start()
                for thread in clients:
                    thread.join(timeout=600)
            finally:
                done.set()
                watcher.join(timeout=60)
            samples.append(database.connections())

            assert not load.errors, load.errors[:3]
            assert not any(t.is_alive() for t in clients), "a client never finished"
            assert len(load.statuses) == CLIENTS * ROUNDS * 4
            failures = [(what, status) for what, status in load.statuses if status != 200]
            assert not failures, f"{failures[:10]}\n{server.log_tail()}"
            # The load was really concurrent beyond the bound, so the bound was tested.
            assert load.peak_in_flight > CONNECTION_BOUND, load.peak_in_flight
            assert 0 < max(samples) <= CONNECTION_BOUND, (max(samples), CONNECTION_BOUND)

            # And everything sent was stored: each stream's head is its last record.
            with server.client(timeout=60) as client:
                for chain in load.chains:
                    head = client.get(f"/api/v1/streams/{chain.stream}").json()["head"]
                    assert head == {"seq": chain.seq, "hash": chain.head}, chain.stream
