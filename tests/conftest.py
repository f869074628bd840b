"""Fixtures shared by the whole suite: two tenants and three people (healthchecks-style), where
the third person, carol, must see nothing of the first tenant.

Tests that need a real Postgres or Redis carry the `postgres` / `redis` marker. Without the
service they skip on a laptop, but under CI=true they fail: CI must never go green by skipping."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, NoReturn

import pytest
from django.conf import settings
from django.db import connection
from rest_framework.test import APIClient

from tenants import services
from tenants.models import Role, Tenant

ALL_SCOPES = ["ingest", "gate", "read", "recovery", "audit", "control"]
PASSWORD = "correct-horse-battery"


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


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
    the runtime role (DATABASE_URL), which row-level security binds (tenants/rls.py)."""
    from django.test.utils import setup_databases, teardown_databases

    from tenants.rls import database_owner

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
    import time

    from django.db.utils import OperationalError

    deadline = time.monotonic() + patience_s
    while True:
        try:
            teardown()
            return
        except OperationalError as exc:
            if "being accessed by other users" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.5)  # cleanup only: waiting for another process to close its session


def _let_the_runtime_role_flush() -> None:
    """Transactional tests end with Django's `flush` (TRUNCATE), run on the test's connection, as
    the runtime role. TRUNCATE is granted here, in the test database only: production's runtime
    role has no TRUNCATE (it is not subject to row-level security)."""
    if connection.vendor != "postgresql":
        return
    role = connection.ops.quote_name(settings.DATABASE_RUNTIME_ROLE)
    with connection.cursor() as cursor:
        cursor.execute(f"GRANT TRUNCATE ON ALL TABLES IN SCHEMA public TO {role}")


def unavailable(message: str) -> NoReturn:
    """Something a test needs is missing: a skip on a laptop, a failure under CI=true (CI must
    never go green by skipping)."""
    if _in_ci():
        pytest.fail(message + " — under CI=true this is a failure, not a skip")
    pytest.skip(message)


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
    """Each test starts with no store marked unreachable (controlplane.availability): a test that
    killed its own Redis or Postgres leaves no refusal behind."""
    from controlplane import availability

    availability.reset()


@pytest.fixture(autouse=True)
def _no_remembered_api_keys() -> None:
    """Each test starts with no API key remembered as checked (tenants.authentication): rows a
    previous test made are gone with its transaction."""
    from tenants import authentication

    with authentication._held_lock:
        authentication._held.clear()


@dataclass
class Person:
    user: Any
    tenant: Tenant
    role: str
    api_key: str

    def session_client(self) -> APIClient:
        client = APIClient()
        client.force_login(self.user)
        client.credentials(HTTP_X_SAGAPLANE_TENANT=self.tenant.slug)
        return client

    def key_client(self) -> APIClient:
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {self.api_key}")
        return client


def server_stream(tenant: Tenant, *, flush: bool = True) -> list[dict[str, Any]]:
    """The tenant's server stream (admin actions, approvals, seals) as stored, oldest first; with
    `flush`, once the records still pending (recovery results, chained in batches) are chained,
    as the recovery sweep chains them within a second."""
    from audit.models import Record, RecordPayload, Redaction
    from audit.services import flush_server_records, stored_record
    from tenants.scoping import tenant_context

    if flush:
        flush_server_records(tenant, wait=True)
    with tenant_context(tenant):
        rows = list(Record.objects.filter(stream__stream_id="server").order_by("position"))
        payloads = {p.record_id: p for p in RecordPayload.objects.filter(record__in=rows)}
        erased = dict(Redaction.objects.values_list("record_id", "reason"))
        return [stored_record(r, payloads.get(r.pk), erased.get(r.pk)) for r in rows]


def at_once(call: Callable[[Any], Any], args: Iterable[Any], patience_s: float = 60.0) -> list[Any]:
    """`call(arg)` for every arg, each in its own thread (and database connection, closed after),
    all released together: what each returned or raised, in the order of `args`. Fails when a
    thread is still running after `patience_s` (a deadlock is a failure, not a hang)."""
    args = list(args)
    barrier = threading.Barrier(len(args))
    outcomes: list[Any] = [None] * len(args)

    def run(n: int) -> None:
        try:
            barrier.wait(patience_s)
            outcomes[n] = call(args[n])
        except BaseException as exc:  # handed to the test: a thread's exception is not a pass
            outcomes[n] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(n,)) for n in range(len(args))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(patience_s)
    assert not any(thread.is_alive() for thread in threads)
    return outcomes


def make_person(tenant: Tenant, name: str, role: str) -> Person:
    membership = services.add_member(tenant, f"{name}@{tenant.slug}.example", role, PASSWORD, actor="test")
    _, raw_key = services.create_api_key(tenant, name=f"{name}-agent", scopes=ALL_SCOPES, actor="test")
    return Person(membership.user, tenant, role, raw_key)


@pytest.fixture
def tenant_a(db: None) -> Tenant:
    return services.create_tenant("acme", "Acme Payments", "founder@acme.example", PASSWORD, actor="test")


@pytest.fixture
def tenant_b(db: None) -> Tenant:
    return services.create_tenant("bravo", "Bravo Logistics", "founder@bravo.example", PASSWORD, actor="test")


@pytest.fixture
def alice(tenant_a: Tenant) -> Person:
    return make_person(tenant_a, "alice", Role.OWNER)


@pytest.fixture
def bob(tenant_a: Tenant) -> Person:
    return make_person(tenant_a, "bob", Role.VIEWER)


@pytest.fixture
def carol(tenant_b: Tenant) -> Person:
    return make_person(tenant_b, "carol", Role.OWNER)


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
