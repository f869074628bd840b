"""Tenant scoping that cannot be forgotten.

Three layers, each enough to stop a leak on its own:
1. ORM: every tenant-owned model inherits `TenantScopedModel`; its default manager filters by the
   tenant active in this context and *raises* when none is active, so an unscoped query is an
   error, not a silent cross-tenant read.
2. API: every tenant view inherits `tenants.permissions.TenantScopedViewMixin`, which activates the
   request's tenant (a test enumerates the URL resolver to check that no view skips it).
3. Postgres: row-level security on every tenant table, keyed by `sagaplane.tenant_id`, which
   `tenant_context` sets with `set_config(..., is_local => true)` (SET LOCAL) for the current
   transaction. Even raw SQL inside a request or a Celery task sees only its tenant's rows, and
   the role the application runs as cannot switch that off (core/rls.py).

Crossing tenants on purpose (authentication looks an API key up before it knows the tenant,
the integrator walks all tenants) asks one narrow question through a cross-tenant function
(`core.rls.cross_tenant_function`: SECURITY DEFINER on Postgres), then enters each tenant with
`tenant_context`. On SQLite the same questions run under `dangerously_bypass_orm_scope()`, which
lifts the ORM layer only: on Postgres, RLS still hides every row from it.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from datetime import datetime
from typing import Any, Protocol

import psycopg
from django.db import DEFAULT_DB_ALIAS, connection, connections, models, transaction
from django.http import HttpRequest, HttpResponse
from psycopg.pq import TransactionStatus

from core.sql import is_postgres

TENANT_SETTING = "sagaplane.tenant_id"


class Tenant(Protocol):
    """What core needs of a tenant: its id, its slug (log lines) and its creation time (the
    per-process caches' keys). Core imports no app, so it names `tenants.Tenant` by this shape."""

    pk: Any
    slug: str
    created_at: datetime


_current_tenant: contextvars.ContextVar[Tenant | None] = contextvars.ContextVar("tenant", default=None)
_bypass: contextvars.ContextVar[bool] = contextvars.ContextVar("tenant_bypass", default=False)


class TenantScopeError(RuntimeError):
    """A tenant-owned table was queried with no tenant active (and no ORM-scope bypass)."""


def current_tenant() -> Tenant:
    tenant = _current_tenant.get()
    if tenant is None:
        raise TenantScopeError("no tenant is active: wrap the work in tenant_context(tenant)")
    return tenant


def _set_local(name: str, value: str) -> None:
    if is_postgres():
        with connection.cursor() as cursor:
            cursor.execute("SELECT set_config(%s, %s, true)", [name, value])


def _transaction_failed() -> bool:
    """The current transaction can run no statement (an error in it, or Django marked it to roll
    back). Its rollback -- to a savepoint taken before the SET LOCAL, or whole -- undoes the SET
    LOCAL by itself; a statement to undo it would only raise, masking the error on its way out."""
    if connection.needs_rollback:
        return True
    raw = connection.connection
    if not is_postgres() or raw is None:
        return False
    return bool(raw.info.transaction_status == TransactionStatus.INERROR)


@contextmanager
def tenant_context(tenant: Tenant) -> Iterator[Tenant]:
    """Run a block as `tenant`, in one transaction: the tenant is current for the ORM and, by a
    SET LOCAL in that transaction, for Postgres RLS. The way Celery tasks, management commands
    and tests enter a tenant; views get it from the mixin. On the way out the previous tenant's
    setting is restored, unless the transaction ends right after (the outermost block: its
    commit or rollback ends the SET LOCAL) or can run no statement (its rollback undoes it)."""
    outermost = not connection.in_atomic_block
    with transaction.atomic():
        token = _current_tenant.set(tenant)
        _set_local(TENANT_SETTING, str(tenant.pk))
        try:
            yield tenant
        finally:
            _current_tenant.reset(token)
            previous = _current_tenant.get()
            if not outermost and not _transaction_failed():
                _set_local(TENANT_SETTING, str(previous.pk) if previous is not None else "")


def require_tenant(tenant: Tenant) -> Tenant:
    """Assert that the caller entered `tenant` (services and actions: the transport enters it once,
    the view mixin, `tenants.entry.tenant_task` or `tenants.entry.command_tenant`; an action never
    opens a scope of its own). Scoped means `tenant` is the ORM's active tenant and Postgres sees it
    too: inside a transaction (the `tenant_context` that set it) or a statement-scoped block whose
    statements each carry it (`tenant_statements`). No round trip. Raises TenantScopeError."""
    active = _current_tenant.get()
    if active is None or active.pk != tenant.pk:
        raise TenantScopeError(
            f"tenant {tenant.pk} is not the active one: enter it at the transport "
            "(view mixin, tenant_task, command_tenant, or tenant_context in a test)"
        )
    db = connections[DEFAULT_DB_ALIAS]  # one thread-local lookup (the gate asserts twice a decision)
    if not db.in_atomic_block and not _statements_carry_tenant(db):
        raise TenantScopeError(f"tenant {tenant.pk} is active outside a transaction")
    return tenant


def _statements_carry_tenant(db: Any = None) -> bool:
    wrappers = (db or connection).execute_wrappers
    return any(getattr(wrapper, "carries_tenant", False) for wrapper in wrappers)


@contextmanager
def joined_tenant_context(tenant: Tenant) -> Iterator[Tenant]:
    """`tenant_context`, except inside a transaction that already runs as `tenant` (a view's):
    then the block simply joins it, with no savepoint and no SET LOCAL to take and undo (four
    round-trips a nesting on a hot path). Only for blocks that leave nothing half-done for a
    caller to catch and carry on after: an exception out of one fails the caller's transaction."""
    active = _current_tenant.get()
    if active is not None and active.pk == tenant.pk and connection.in_atomic_block:
        yield tenant
        return
    with tenant_context(tenant):
        yield tenant


def tenant_statements(tenant: Tenant) -> AbstractContextManager[Tenant]:
    """Run a block as `tenant` with no transaction of its own (Postgres; hot read paths whose
    statements need no common snapshot, such as a proof): every statement carries the RLS
    setting in its own round-trip, as `SELECT set_config(..., true); <statement>` in one
    simple-protocol message. Postgres runs such a message in order as one implicit transaction
    (or inside the caller's), so the statement runs as the tenant and the setting ends with it:
    nothing for a BEGIN, a SET or a COMMIT to do. A statement that cannot carry it (not psycopg's
    client-side binding cursor, Django's default; an executemany) gets the setting as a statement
    of its own inside a transaction, and is refused outside one (it would run with no tenant).
    Each statement carries the tenant active when it runs, so a `tenant_context` or another
    `tenant_statements` nested inside runs as its own tenant. A batch that sets the active tenant
    itself (`statement_prefix`: fleet's ledger insert) is sent as it is, and so is a failed
    transaction's undo. On SQLite this is `tenant_context`."""
    if not is_postgres():
        return tenant_context(tenant)
    return _StatementScope(tenant)


class _CarryTenant:
    """A statement-scoped block's execute wrapper: each statement carries the tenant active when
    it runs (not the block's: a `tenant_context` or a nested block inside runs its statements as
    its own tenant; none active runs as no tenant)."""

    carries_tenant = True  # what `_statements_carry_tenant` looks for

    def __init__(self, db: Any) -> None:
        self.db = db
        self.sent_in_transaction = False

    def __call__(
        self, execute: Callable[..., Any], sql: str, params: Any, many: bool, context: dict[str, Any]
    ) -> Any:
        active = _current_tenant.get()
        prefix = statement_prefix(active.pk if active is not None else None)
        raw = context["cursor"].cursor
        in_transaction = self.db.in_atomic_block
        if in_transaction and raw.connection.info.transaction_status == TransactionStatus.INERROR:
            # A failed transaction runs nothing but its undo (a savepoint's ROLLBACK TO, after an
            # error a caller catches); a prefix would fail first and skip it, breaking the
            # transaction for good. The undo reads no row, so it needs no tenant.
            return execute(sql, params, many, context)
        self.sent_in_transaction = self.sent_in_transaction or in_transaction
        if sql.startswith(prefix[:-2]):
            # A hand-written batch that sets this very tenant itself (fleet's ledger insert, with
            # its own synchronous_commit): sent as it is, not with the setting twice.
            return execute(sql, params, many, context)
        if many or not isinstance(raw, psycopg.ClientCursor):
            if not in_transaction:
                raise TenantScopeError("this statement cannot carry the tenant: run it in a transaction")
            # On a plain cursor of the same connection: a named (server-side) cursor would only
            # DECLARE the set_config, never run it, and the statement would see a stale setting.
            with raw.connection.cursor() as setter:
                setter.execute(prefix)
            return execute(sql, params, many, context)
        result = execute(prefix + sql, params, many, context)
        raw.nextset()  # the statement's own result, not set_config's
        return result


class _TenantAndWrapper:
    """The ORM layer's tenant is `tenant` and every statement passes `wrapper`, for the block
    (`wrapper` None: the tenant only). A class rather than a generator: the gate enters two such
    blocks a decision."""

    def __init__(self, tenant: Tenant, wrapper: Callable[..., Any] | None) -> None:
        self.tenant, self.wrapper = tenant, wrapper

    def __enter__(self) -> Tenant:
        return self._enter(connections[DEFAULT_DB_ALIAS])

    def _enter(self, db: Any) -> Tenant:
        self.db = db
        self.token = _current_tenant.set(self.tenant)
        if self.wrapper is not None:
            self.db.execute_wrappers.append(self.wrapper)
        return self.tenant

    def __exit__(self, *exc_info: object) -> None:
        try:
            if self.wrapper is not None:
                self.db.execute_wrappers.pop()
        finally:
            _current_tenant.reset(self.token)


class _StatementScope(_TenantAndWrapper):
    def __init__(self, tenant: Tenant) -> None:
        super().__init__(tenant, None)

    def __enter__(self) -> Tenant:
        db = connections[DEFAULT_DB_ALIAS]
        # Nested in another statement-scoped block on this connection, its wrapper already sends
        # the tenant active at each statement (a second wrapper would prefix the outer one's
        # set_config last, and every statement in here would run as the outer tenant).
        self.wrapper = None if _statements_carry_tenant(db) else _CarryTenant(db)
        return self._enter(db)

    def __exit__(self, *exc_info: object) -> None:
        super().__exit__(*exc_info)
        carried = self.wrapper
        if (
            isinstance(carried, _CarryTenant)
            and carried.sent_in_transaction
            and self.db.in_atomic_block
            and not _transaction_failed()
        ):
            # A caller's transaction (a test's) would keep the SET LOCAL after the block.
            previous = _current_tenant.get()
            _set_local(TENANT_SETTING, str(previous.pk) if previous is not None else "")


def statement_prefix(tenant_pk: int | None, *, synchronous_commit_off: bool = False) -> str:
    """The statement-scoped fast path's one piece of SQL (Postgres): `SELECT set_config(...); `
    sent in the same simple-protocol message as the statement after it, so that statement runs as
    the tenant (row-level security) in the message's implicit transaction, or the caller's, and
    the setting ends with it. Used by `tenant_statements` for every statement of its block and by
    hand-written batches (fleet's ledger insert). `synchronous_commit_off`: that transaction's
    commit does not wait for the WAL flush (a row worth no fsync). No tenant: runs as none."""
    tenant = str(int(tenant_pk)) if tenant_pk is not None else ""
    settings = f"set_config('{TENANT_SETTING}', '{tenant}', true)"
    if synchronous_commit_off:
        settings += ", set_config('synchronous_commit', 'off', true)"
    return f"SELECT {settings}; "


class NeedsDatabase(Exception):
    """Code run under `scoped_without_database` tried to run an SQL statement."""


def scoped_without_database(tenant: Tenant) -> AbstractContextManager[Tenant]:
    """The ORM layer's tenant only, and no database: any SQL statement raises `NeedsDatabase`
    before it is sent. For hot paths that usually answer from per-process copies (the gate) and
    must redo the work inside `tenant_context` (transaction and RLS) when they cannot."""

    return _TenantAndWrapper(tenant, _refuse_statement)


def _refuse_statement(*_args: Any) -> Any:
    raise NeedsDatabase


@contextmanager
def dangerously_bypass_orm_scope() -> Iterator[None]:
    """Lift the ORM layer: the tenant manager stops filtering. For the SQLite side of the
    cross-tenant questions only. It does nothing to Postgres' row-level security, so on Postgres
    a query in here with no tenant active sees no tenant's rows."""
    token = _bypass.set(True)
    try:
        yield
    finally:
        _bypass.reset(token)


class TenantManager(models.Manager):
    """The default manager of tenant-owned models: the active tenant's rows, or an error."""

    def get_queryset(self) -> models.QuerySet:
        queryset = super().get_queryset()
        if _bypass.get():
            return queryset
        return queryset.filter(tenant=current_tenant())


def tenant_field(*, db_index: bool = True) -> Any:
    """A tenant-scoped model's `tenant`. `db_index=False` where an index that leads with the tenant
    already serves it: a lone tenant index is one more write per row, and with statistics older
    than a tenant's growth the planner reads all of a big tenant's rows through it (docs/SCALING.md)."""
    return models.ForeignKey(
        "tenants.Tenant", on_delete=models.CASCADE, related_name="+", editable=False, db_index=db_index
    )


class TenantScopedModel(models.Model):
    tenant = tenant_field()

    objects = TenantManager()

    class Meta:
        abstract = True

    def save(self, *args: Any, **kwargs: Any) -> None:
        active = _current_tenant.get()
        if self.tenant_id is None:
            self.tenant = current_tenant()
        elif active is not None and self.tenant_id != active.pk and not _bypass.get():
            raise TenantScopeError(
                f"{type(self).__name__} of tenant {self.tenant_id} saved while tenant {active.pk} is active"
            )
        super().save(*args, **kwargs)


def tenant_scoped_models() -> list[type[models.Model]]:
    from django.apps import apps

    return [
        model
        for model in apps.get_models()
        if issubclass(model, TenantScopedModel) and model._meta.managed and not model._meta.proxy
    ]


class TenantContextResetMiddleware:
    """A request starts and ends with no tenant active, whatever the previous request on this
    thread did: a leaked context would be a cross-tenant read waiting to happen."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        token = _current_tenant.set(None)
        bypass_token = _bypass.set(False)
        try:
            return self.get_response(request)
        finally:
            _current_tenant.reset(token)
            _bypass.reset(bypass_token)
