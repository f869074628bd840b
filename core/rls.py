"""Postgres row-level security and the two database roles.

The runtime role (DATABASE_URL: web, workers, beat) owns nothing, is not superuser and has no
BYPASSRLS. Every tenant table has a policy keyed only by `sagaplane.tenant_id` (which
`tenant_context` sets for its transaction), and the policy binds every role but the table's owner.
So the runtime role sees only the active tenant's rows, and there is nothing it can do about it:
no setting switches the policy off, and ALTER TABLE / DROP POLICY need the owner.

The owner role (DATABASE_OWNER_URL) runs `migrate` and owns the tables. After each migrate
(`install`, a post_migrate hook) it enables RLS and (re)creates the policy on every tenant table,
grants the runtime role DML on the tables, and creates the cross-tenant functions.

Crossing tenants (which tenant an API key belongs to, a person's memberships, which tenants the
integrator must visit) goes through `SECURITY DEFINER` functions owned by the owner role: each runs
one fixed query as the owner, whom RLS does not bind, and returns only what its question needs;
the caller then enters the tenant with `tenant_context` for the rest. RLS is enabled but not
FORCEd: FORCE would bind the owner too, and the functions would then need a second policy for the
owner, which says the same thing with more parts. FORCE only guards against the table owner, and
the owner can lift it (ALTER TABLE ... NO FORCE) anyway; what matters is that the role the
application runs as owns nothing, which `runtime_role_problems` checks at start.

On SQLite (embedded mode) there are no roles and no RLS: the ORM layer alone scopes, and each
cross-tenant question runs as an ORM query under `scoping.dangerously_bypass_orm_scope`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import CommandError
from django.db import DatabaseError, connection, connections, transaction
from django.http import HttpRequest, HttpResponse, JsonResponse

from core.scoping import TENANT_SETTING, tenant_scoped_models

log = logging.getLogger(__name__)

POLICY = "tenant_isolation"


# --------------------------------------------------------------------- cross-tenant functions


@dataclass(frozen=True)
class CrossTenantFunction:
    """A question that must cross tenants, answered on Postgres by a SECURITY DEFINER function
    (created by `install` as the owner role). `body` is one SQL query that uses the arguments by
    name: name them so they cannot be mistaken for a column (a column wins in SQL functions)."""

    name: str
    arguments: str  # e.g. "wanted_prefix text"
    returns: str  # e.g. "TABLE (tenant_id bigint)"
    body: str

    def create_statement(self, schema: str) -> str:
        return (
            f"CREATE OR REPLACE FUNCTION {self.name}({self.arguments}) RETURNS {self.returns} "
            f"LANGUAGE sql STABLE SECURITY DEFINER SET search_path = {schema}, pg_temp "
            f"AS $sagaplane$ {self.body} $sagaplane$"
        )

    @property
    def signature(self) -> str:
        return f"{self.name}({self.arguments})"

    def rows(self, *args: Any) -> list[tuple[Any, ...]]:
        """Call the function (Postgres only) and return its rows."""
        placeholders = ", ".join(["%s"] * len(args))
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT * FROM {self.name}({placeholders})", list(args))
            return cursor.fetchall()


_functions: dict[str, CrossTenantFunction] = {}


def cross_tenant_function(name: str, *, arguments: str, returns: str, body: str) -> CrossTenantFunction:
    """Declare a cross-tenant function (at import of the module that asks the question; its app
    imports that module in AppConfig.ready, so `install` knows every function)."""
    function = CrossTenantFunction(name, arguments, returns, body)
    if _functions.get(name, function) != function:
        raise ValueError(f"two different cross-tenant functions are named {name}")
    _functions[name] = function
    return function


def cross_tenant_functions() -> list[CrossTenantFunction]:
    return sorted(_functions.values(), key=lambda f: f.name)


def enforces_rls(using: str = "default") -> bool:
    """Whether the database binds the application with row-level security (Postgres)."""
    return connections[using].vendor == "postgresql"


# --------------------------------------------------------------------- install (post_migrate)


def _policy_predicate() -> str:
    return f"tenant_id = NULLIF(current_setting('{TENANT_SETTING}', true), '')::bigint"


def install(using: str = "default", **_: Any) -> None:
    """Row-level security on every tenant table, the runtime role's grants and the cross-tenant
    functions; idempotent. Runs after every migrate (as the owner), so a new tenant model is
    covered without anyone remembering to add a policy. One transaction: processes running
    meanwhile (a rolling release) see the old policies and functions or the new ones."""
    conn = connections[using]
    if conn.vendor != "postgresql":
        return
    tables = [model._meta.db_table for model in tenant_scoped_models()]
    with transaction.atomic(using=using), conn.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM unnest(%s::text[]) AS t(name) "
            "JOIN pg_class c ON c.oid = to_regclass(t.name) "
            "WHERE pg_has_role(current_user, c.relowner, 'USAGE')",
            [tables],
        )
        if cursor.fetchone()[0] == 0:
            # Not the owner: the runtime role emits post_migrate too (Django's `flush`, which tests
            # run); the owner installed everything when it migrated.
            return
        cursor.execute("SELECT current_user, current_schema()")
        current_user, schema = cursor.fetchone()
        schema = conn.ops.quote_name(schema)
        predicate = _policy_predicate()
        cursor.execute(
            "SELECT t.name, c.relrowsecurity, c.relforcerowsecurity, "
            "EXISTS (SELECT FROM pg_policy p WHERE p.polrelid = c.oid AND p.polname = %s) "
            "FROM unnest(%s::text[]) AS t(name) JOIN pg_class c ON c.oid = to_regclass(t.name)",
            [POLICY, tables],
        )
        for name, enabled, forced, has_policy in cursor.fetchall():
            table = conn.ops.quote_name(name)
            if not enabled:
                cursor.execute(f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY")
            if forced:
                # Not FORCEd: the owner is exempt, so the SECURITY DEFINER functions can cross
                # tenants (an install from before the owner role forced it).
                cursor.execute(f"ALTER TABLE {table} NO FORCE ROW LEVEL SECURITY")
            verb = "ALTER" if has_policy else "CREATE"
            cursor.execute(f"{verb} POLICY {POLICY} ON {table} USING ({predicate}) WITH CHECK ({predicate})")
        for function in cross_tenant_functions():
            cursor.execute(function.create_statement(schema))
            cursor.execute(f"REVOKE ALL ON FUNCTION {function.signature} FROM PUBLIC")
        runtime = settings.DATABASE_RUNTIME_ROLE
        if not runtime or runtime == current_user:
            return  # one role for everything: the runtime checks refuse to serve with it
        role = conn.ops.quote_name(runtime)
        cursor.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {schema} TO {role}")
        cursor.execute(f"GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA {schema} TO {role}")
        # The migration history is the owner's: the runtime role may read it (runserver's warning).
        migrations = conn.ops.quote_name("django_migrations")
        cursor.execute(f"REVOKE INSERT, UPDATE, DELETE ON {migrations} FROM {role}")
        for function in cross_tenant_functions():
            cursor.execute(f"GRANT EXECUTE ON FUNCTION {function.signature} TO {role}")


# --------------------------------------------------------------------- the two roles


_owner_aliases: set[str] = set()


def _reconnect(alias: str, credentials: dict[str, Any]) -> None:
    conn = connections[alias]
    conn.close()
    if hasattr(conn, "close_pool"):
        conn.close_pool()  # the pool was opened with the other role's credentials
    conn.settings_dict.update(credentials)


@contextmanager
def database_owner(alias: str = "default") -> Iterator[None]:
    """Run the block connected as the owner role (DATABASE_OWNER_URL), then as the runtime role
    again; for `migrate` and the test database's creation. Nothing changes on SQLite. On Postgres
    without DATABASE_OWNER_URL, refuses: the tables must not belong to the runtime role."""
    conn = connections[alias]
    if conn.vendor != "postgresql" or alias in _owner_aliases:
        yield
        return
    if settings.DATABASE_OWNER is None:
        raise CommandError(
            "DATABASE_OWNER_URL must be set to migrate a Postgres database: the tables belong to an "
            "owner role, and DATABASE_URL's role, which the application runs as, must own none "
            "(README, 'Database roles')"
        )
    runtime = {key: conn.settings_dict.get(key) for key in ("USER", "PASSWORD")}
    _reconnect(alias, dict(settings.DATABASE_OWNER))
    _owner_aliases.add(alias)
    try:
        yield
    finally:
        _owner_aliases.discard(alias)
        _reconnect(alias, runtime)


def _some(names: list[str], shown: int = 3) -> str:
    return ", ".join(names[:shown]) + (f" and {len(names) - shown} more" if len(names) > shown else "")


def runtime_role_problems(using: str = "default") -> list[str]:
    """Why the role this process runs as may not serve tenants (empty when it may): it must not be
    a superuser nor BYPASSRLS (either ignores RLS), must own no tenant table (an owner is exempt
    from its table's policy, and could drop it), and every tenant table must have its policy."""
    conn = connections[using]
    if conn.vendor != "postgresql":
        return []
    tables = [model._meta.db_table for model in tenant_scoped_models()]
    with conn.cursor() as cursor:
        cursor.execute(
            "SELECT current_user, rolsuper, rolbypassrls FROM pg_roles WHERE rolname = current_user"
        )
        user, superuser, bypasses_rls = cursor.fetchone()
        cursor.execute(
            "SELECT t.name, c.oid IS NOT NULL, "
            "coalesce(pg_has_role(current_user, c.relowner, 'MEMBER'), false), "
            "coalesce(c.relrowsecurity, false), "
            "EXISTS (SELECT FROM pg_policy p WHERE p.polrelid = c.oid AND p.polname = %s) "
            "FROM unnest(%s::text[]) AS t(name) LEFT JOIN pg_class c ON c.oid = to_regclass(t.name) "
            "ORDER BY t.name",
            [POLICY, tables],
        )
        rows = cursor.fetchall()
    problems = []
    if superuser:
        problems.append(
            f"DATABASE_URL's role {user!r} is a superuser, which row-level security does not bind: "
            "use a role without SUPERUSER"
        )
    if bypasses_rls:
        problems.append(f"DATABASE_URL's role {user!r} has BYPASSRLS: use a role without it")
    owned = [name for name, exists, owns, _, _ in rows if exists and owns]
    if owned:
        problems.append(
            f"DATABASE_URL's role {user!r} owns tenant tables ({_some(owned)}), and a table's owner "
            "is exempt from its policy: the tables must belong to the owner role (DATABASE_OWNER_URL), "
            "which runs migrate"
        )
    missing = [name for name, exists, _, _, _ in rows if not exists]
    if missing:
        problems.append(f"tenant tables are missing ({_some(missing)}): run `python manage.py migrate`")
    unprotected = [name for name, exists, _, enabled, policy in rows if exists and not (enabled and policy)]
    if unprotected:
        problems.append(
            f"tenant tables have no row-level security policy ({_some(unprotected)}): "
            "run `python manage.py migrate` (as the owner role, DATABASE_OWNER_URL)"
        )
    return problems


@checks.register(checks.Tags.database)
def check_runtime_role(databases: Any = None, **_: Any) -> list[checks.CheckMessage]:
    """`manage.py check --database default`: the runtime role is fit to serve (not while
    `migrate` runs as the owner)."""
    if not databases or "default" not in databases or "default" in _owner_aliases:
        return []
    try:
        problems = runtime_role_problems("default")
    except DatabaseError as exc:
        return [checks.Error(f"could not check DATABASE_URL's role: {type(exc).__name__}", id="tenants.E002")]
    return [checks.Error(problem, id="tenants.E001") for problem in problems]


def refuse_unsafe_runtime_role() -> None:
    """For processes that serve tenants (Celery workers and beat at start): raise, naming each
    problem, when the runtime role is unfit. A database that does not answer yet is left to the
    first task (and to /readyz)."""
    try:
        problems = runtime_role_problems()
    except DatabaseError:
        log.warning("could not check DATABASE_URL's role at start", exc_info=True)
        return
    finally:
        if not connection.in_atomic_block:
            connection.close()  # a worker's parent must not carry a connection into its forks
    if problems:
        raise ImproperlyConfigured("Refusing to start: unsafe database role:\n- " + "\n- ".join(problems))


class RuntimeRoleGuardMiddleware:
    """Fail closed in web processes: until the runtime role has been found fit (once per process,
    on the first request), a process whose role row-level security does not bind answers 503 to
    everything but the probes, and logs why. /readyz reports it too, for orchestrators."""

    PROBES = ("/healthz", "/readyz")
    verified = False  # per process: the role does not change under a running process

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if not RuntimeRoleGuardMiddleware.verified and request.path not in self.PROBES:
            try:
                problems = runtime_role_problems()
            except DatabaseError:
                problems = None  # the request will meet the outage itself; check again next time
            if problems:
                log.error("refusing to serve: unsafe database role:\n- %s", "\n- ".join(problems))
                return JsonResponse(
                    {"error": "unsafe_database_role", "detail": "this server is misconfigured; see its log"},
                    status=503,
                )
            RuntimeRoleGuardMiddleware.verified = problems == []
        return self.get_response(request)
