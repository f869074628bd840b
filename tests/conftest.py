"""Fixtures shared by the whole suite: two tenants and three people (healthchecks-style), where
the third person, carol, must see nothing of the first tenant.

Tests that need a real Postgres or Redis carry the `postgres` / `redis` marker. Without the
service they skip on a laptop, but under CI=true they fail: CI must never go green by skipping."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.db import connection

from tenants import founding
from tenants.actors import named_actor
from tenants.models import Role, Tenant
from tests.support.approvals import Agent, payments_agent
from tests.support.cleanup import retried_while
from tests.support.factories import PASSWORD, Person, make_person
from tests.support.prerequisites import unavailable


def _redis_reachable() -> bool:
    if not settings.REDIS_URL:
        return False
    import redis

    try:
        redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=1).ping()
        return True
    except redis.RedisError:
        return False


@pytest.fixture(scope="session")
def django_db_setup(
    request: pytest.FixtureRequest,
    django_test_environment: None,
    django_db_blocker: Any,
    django_db_keepdb: bool,
    django_db_createdb: bool,
    django_db_modify_db_settings: None,
) -> Iterator[None]:
    """pytest-django's set-up, except that on Postgres the owner role (DATABASE_OWNER_URL) creates,
    migrates and drops the test database, as `migrate` does in production, and the tests run as
    the runtime role (DATABASE_URL), which row-level security binds (core/rls.py)."""
    from django.test.utils import setup_databases, teardown_databases

    from core.rls import database_owner

    verbosity = request.config.option.verbose
    with django_db_blocker.unblock(), database_owner():
        databases = setup_databases(
            verbosity=verbosity,
            interactive=False,
            keepdb=django_db_keepdb and not django_db_createdb,
            aliases=None,  # every database: there is one
            serialized_aliases=set(),  # no test uses serialized_rollback
        )
        _let_the_runtime_role_flush()
    yield
    if not django_db_keepdb:
        with django_db_blocker.unblock(), database_owner():
            _drop_when_released(lambda: teardown_databases(databases, verbosity=verbosity))


def _drop_when_released(teardown: Any, patience_s: float = 60.0) -> None:
    """Drop the test database once the last session on it has closed. A live-server thread or a
    child process a test started can still be closing its connection when the session ends;
    Postgres then refuses the DROP ("is being accessed by other users"), which failed a run whose
    every test had passed. Other errors, or sessions that outlive the patience, still fail it."""
    retried_while("being accessed by other users", teardown, patience_s=patience_s)


@pytest.fixture(autouse=True, scope="session")
def _flush_outlasts_a_live_server_reader() -> Iterator[None]:
    """A transactional test ends with `flush` (TRUNCATE of every table). A live-server thread may
    still be answering a request the test's agent sent before it exited (a status long-poll reads
    the database for up to 25 s: the threaded test server, unlike ASGI, cannot tell its client
    left). TRUNCATE's exclusive locks and that thread's reads can then deadlock, and Postgres
    aborts the TRUNCATE: the test's data stayed, and the next test's set-up failed on it. The
    flush is tried again, as any deadlock victim is, for longer than such a read lasts; other errors
    still fail the test."""
    from django.test import TransactionTestCase

    original = TransactionTestCase._fixture_teardown  # type: ignore[attr-defined]

    def teardown(self: TransactionTestCase) -> None:
        retried_while("deadlock detected", lambda: original(self), patience_s=30.0)

    setattr(TransactionTestCase, "_fixture_teardown", teardown)  # noqa: B010 (a private hook)
    yield
    setattr(TransactionTestCase, "_fixture_teardown", original)  # noqa: B010


def _let_the_runtime_role_flush() -> None:
    """Transactional tests end with Django's `flush` (TRUNCATE), run on the test's connection, as
    the runtime role. TRUNCATE is granted here, in the test database only: production's runtime
    role has no TRUNCATE (it is not subject to row-level security)."""
    if connection.vendor != "postgresql":
        return
    role = connection.ops.quote_name(settings.DATABASE_RUNTIME_ROLE)
    with connection.cursor() as cursor:
        cursor.execute(f"GRANT TRUNCATE ON ALL TABLES IN SCHEMA public TO {role}")


@pytest.fixture(autouse=True)
def _require_services(request: pytest.FixtureRequest) -> None:
    missing = []
    if request.node.get_closest_marker("postgres") and connection.vendor != "postgresql":
        missing.append("Postgres (set DATABASE_URL=postgres://...)")
    if request.node.get_closest_marker("redis") and not _redis_reachable():
        missing.append("Redis (set REDIS_URL=redis://... and start it)")
    if missing:
        unavailable("needs " + " and ".join(missing))


@pytest.fixture(autouse=True)
def _stores_reachable() -> None:
    """Each test starts with no store marked unreachable (core.availability): a test that
    killed its own Redis or Postgres leaves no refusal behind."""
    from core import availability

    availability.reset()


@pytest.fixture(autouse=True)
def _no_remembered_api_keys() -> None:
    """Each test starts with no API key remembered as checked (tenants.authentication): rows a
    previous test made are gone with its transaction."""
    from tenants import authentication

    with authentication._held_lock:
        authentication._held.clear()


@pytest.fixture
def tenant_a(db: None) -> Tenant:
    return founding.create_tenant(
        "acme", "Acme Payments", "founder@acme.example", PASSWORD, actor=named_actor("test")
    )


@pytest.fixture
def tenant_b(db: None) -> Tenant:
    return founding.create_tenant(
        "bravo", "Bravo Logistics", "founder@bravo.example", PASSWORD, actor=named_actor("test")
    )


@pytest.fixture
def alice(tenant_a: Tenant) -> Person:
    return make_person(tenant_a, "alice", Role.OWNER)


@pytest.fixture
def bob(tenant_a: Tenant) -> Person:
    return make_person(tenant_a, "bob", Role.VIEWER)


@pytest.fixture
def carol(tenant_b: Tenant) -> Person:
    return make_person(tenant_b, "carol", Role.OWNER)


@pytest.fixture
def ann(tenant_a: Tenant) -> Person:
    return make_person(tenant_a, "ann", Role.APPROVER)


@pytest.fixture
def ben(tenant_a: Tenant) -> Person:
    return make_person(tenant_a, "ben", Role.APPROVER)


@pytest.fixture
def adam(tenant_a: Tenant) -> Person:
    return make_person(tenant_a, "adam", Role.ADMIN)


@pytest.fixture
def agent(alice: Person) -> Agent:
    """The payments agent's key, created by alice: she is the requester of what it asks."""
    return payments_agent(alice)


@pytest.fixture(autouse=True)
def _fresh_cache() -> None:
    # Coalescing state (transparency's integration requests) lives in the cache and must not
    # leak from one test to the next. On Redis only the cache's own keys go (never FLUSHDB: the
    # server and its database are shared with the broker and with other runs).
    from django.core.cache import caches
    from django.core.cache.backends.redis import RedisCache

    cache = caches["default"]
    if isinstance(cache, RedisCache):
        client = cache._cache.get_client(write=True)
        keys = list(client.scan_iter(match=cache.make_key("*"), count=1000))
        if keys:
            client.delete(*keys)
    else:
        cache.clear()


@pytest.fixture(autouse=True)
def _fast_password_hashing(settings: Any) -> None:
    # PBKDF2's deliberate slowness protects real passwords; in tests it only slows the suite.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def database_store() -> Iterator[None]:
    """The gate counts in the database store for the test: the shared Redis stays untouched (the
    stores have their own tests). Modules use it with `pytest.mark.usefixtures("database_store")`."""
    from fleet import services as fleet
    from fleet.stores import DatabaseStore

    fleet.set_store(DatabaseStore())
    yield
    fleet.set_store(None)
