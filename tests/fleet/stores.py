"""The limit stores the fleet's tests run on: each test of a module using `store` runs on the
database's and on a private Redis (its own server for the module, flushed for each test)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from fleet import services
from fleet.stores import DatabaseStore, LimitStore, RedisStore
from tests.hostile.production import OwnRedis, own_redis


@pytest.fixture(scope="module")
def private_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OwnRedis]:
    with own_redis(tmp_path_factory.mktemp("lease-redis")) as server:
        yield server


def redis_store(server: OwnRedis) -> RedisStore:
    client = redis.Redis.from_url(server.url, socket_timeout=2, socket_connect_timeout=2)
    client.flushall()
    store = RedisStore(client, services.ledger_since)
    store.fence_ms = 1000
    store.commit_deadline_ms = 500
    return store


@pytest.fixture(params=["database", "redis"])
def store(request: pytest.FixtureRequest) -> Iterator[LimitStore]:
    chosen: LimitStore = (
        DatabaseStore()
        if request.param == "database"
        else redis_store(request.getfixturevalue("private_redis"))
    )
    services.set_store(chosen)
    yield chosen
    services.set_store(None)
