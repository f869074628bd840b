"""Fixtures of the gate tests: a private redis-server per module, and a store on it the gate uses
(a module may define its own)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from fleet import services
from fleet.stores import RedisStore
from tests.hostile.production import OwnRedis, own_redis


@pytest.fixture(scope="module")
def private_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OwnRedis]:
    with own_redis(tmp_path_factory.mktemp("lean-redis")) as server:
        yield server


@pytest.fixture
def store(private_redis: OwnRedis) -> Iterator[RedisStore]:
    client = redis.Redis.from_url(private_redis.url, socket_timeout=2, socket_connect_timeout=2)
    client.flushall()
    store = RedisStore(client, services.ledger_since)
    services.set_store(store)
    yield store
    services.set_store(None)
