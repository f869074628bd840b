"""The two database roles and the cross-tenant functions (core/rls.py).

The tests run as the runtime role (DATABASE_URL); the owner role (DATABASE_OWNER_URL) created and
migrated the test database (tests/conftest.py). The cross-tenant selectors also run on SQLite,
where they are ORM queries with the tenant filter lifted: same answers, by another road."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from core import rls
from core.scoping import tenant_context, tenant_scoped_models
from tenants import selectors
from tenants.actors import named_actor
from tenants.models import ApiKey, Membership, Role, Tenant
from tests.support.factories import Person, make_person
from tests.support.scoping import in_tenant
from transparency.tasks import integrate_fully


def _owner_role() -> str:
    assert settings.DATABASE_OWNER is not None, "DATABASE_OWNER_URL is set wherever Postgres is"
    return settings.DATABASE_OWNER["USER"]


class _RolledBack(Exception):
    """Raised to leave an atomic block through its rollback."""


def _insert_membership(tenant: Tenant, user: Any) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {Membership._meta.db_table} (tenant_id, user_id, role, created_at) "
            "VALUES (%s, %s, 'owner', now())",
            [tenant.pk, user.pk],
        )


def _is_member(tenant: Tenant, user: Any) -> bool:
    with tenant_context(tenant):
        return Membership.objects.filter(user=user).exists()


@pytest.mark.postgres
def test_raw_insert_into_another_tenant_is_refused(tenant_a: Tenant, tenant_b: Tenant, carol: Person) -> None:
    """Carol (of bravo) makes herself an owner of acme in raw SQL. Nothing but RLS stands in the
    way: the row violates no constraint, and raw SQL skips the ORM's checks."""
    assert not _is_member(tenant_a, carol.user)
    with tenant_context(tenant_b), pytest.raises(DatabaseError) as refused, transaction.atomic():
        _insert_membership(tenant_a, carol.user)
    assert getattr(refused.value.__cause__, "sqlstate", None) == "42501", (
        refused.value
    )  # insufficient_privilege
    assert "row-level security" in str(refused.value)
    assert not _is_member(tenant_a, carol.user)

    # The control: the very same row goes in with acme active, so it was the policy that refused
    # it above, not a constraint. The savepoint undoes it.
    with tenant_context(tenant_a), pytest.raises(_RolledBack), transaction.atomic():
        _insert_membership(tenant_a, carol.user)
        assert _is_member(tenant_a, carol.user)
        raise _RolledBack
    assert not _is_member(tenant_a, carol.user)


@pytest.mark.postgres
def test_the_runtime_role_is_fit_to_serve(db: None) -> None:
    assert rls.runtime_role_problems() == []
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT current_user, rolsuper, rolbypassrls FROM pg_roles WHERE rolname = current_user"
        )
        user, superuser, bypasses_rls = cursor.fetchone()
        assert user == settings.DATABASE_RUNTIME_ROLE != _owner_role()
        assert not superuser and not bypasses_rls
        for model in tenant_scoped_models():
            cursor.execute(
                "SELECT relrowsecurity, pg_get_userbyid(relowner) FROM pg_class WHERE oid = to_regclass(%s)",
                [model._meta.db_table],
            )
            enabled, owner = cursor.fetchone()
            assert enabled, f"{model._meta.db_table} has no row-level security"
            assert owner == _owner_role(), f"{model._meta.db_table} is owned by {owner}"


@pytest.mark.postgres
def test_cross_tenant_functions_are_the_owners_definers_and_only_callable(db: None) -> None:
    names = [function.name for function in rls.cross_tenant_functions()]
    assert {
        "sagaplane_api_key_tenant",
        "sagaplane_memberships_of",
        "sagaplane_tenants_to_integrate",
        "sagaplane_tenants_to_seal",
        "sagaplane_stale_exports",
        "sagaplane_pending_approvals_count",
        "sagaplane_recovery_queue_depths",
        "sagaplane_tenants_with_unclaimed_recovery_jobs",
        "sagaplane_reconciliation_backlog",
    } <= set(names)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT proname, prosecdef, pg_get_userbyid(proowner), proconfig, "
            "has_function_privilege(current_user, oid, 'EXECUTE'), "
            "coalesce(array_to_string(proacl, ','), '') "
            "FROM pg_proc WHERE proname = ANY(%s) ORDER BY proname",
            [names],
        )
        rows = cursor.fetchall()
    assert [row[0] for row in rows] == sorted(names)
    for name, definer, owner, config, executable, acl in rows:
        assert definer, f"{name} is not SECURITY DEFINER"
        assert owner == _owner_role(), name
        assert any(setting.startswith("search_path=") for setting in config or []), (
            f"{name}: search_path not pinned"
        )
        assert executable, f"the runtime role cannot call {name}"
        assert not any(entry.startswith("=") for entry in acl.split(",")), f"PUBLIC may call {name}: {acl}"


def test_tenant_of_api_key(tenant_a: Tenant, tenant_b: Tenant, alice: Person, carol: Person) -> None:
    assert selectors.tenant_of_api_key(ApiKey.prefix_of(alice.api_key) or "") == tenant_a
    assert selectors.tenant_of_api_key(ApiKey.prefix_of(carol.api_key) or "") == tenant_b
    assert selectors.tenant_of_api_key("zzzzzzzzzzzz") is None
    for hostile in ("", "short", "ABCDEFGHIJKL", "a\x00bcdefghijk", "'; select 1--x"):
        assert selectors.tenant_of_api_key(hostile) is None


@pytest.mark.postgres
def test_the_key_function_answers_only_which_tenant(tenant_a: Tenant, alice: Person, carol: Person) -> None:
    prefix = ApiKey.prefix_of(alice.api_key)
    with connection.cursor() as cursor:
        cursor.execute("SELECT * FROM sagaplane_api_key_tenant(%s)", [prefix])
        assert [column.name for column in cursor.description] == ["tenant_id"]
        assert cursor.fetchall() == [(tenant_a.pk,)]


def test_memberships_of_are_the_persons_own(
    tenant_a: Tenant, tenant_b: Tenant, alice: Person, carol: Person
) -> None:
    from tenants import services

    # Alice joins bravo as a viewer: two memberships; carol's are not among them.
    in_tenant(
        services.add_member, tenant_b, alice.user.email, Role.VIEWER, "x" * 12, actor=named_actor("test")
    )
    memberships = selectors.memberships_of(alice.user)
    assert [(m.tenant.slug, m.role, m.user_id) for m in memberships] == [
        ("acme", Role.OWNER, alice.user.pk),
        ("bravo", Role.VIEWER, alice.user.pk),
    ]
    with tenant_context(tenant_a):
        stored = Membership.objects.get(user=alice.user)
    assert (memberships[0].pk, memberships[0].created_at) == (stored.pk, stored.created_at)
    assert [m.tenant.slug for m in selectors.memberships_of(carol.user)] == ["bravo"]
    assert selectors.memberships_of(get_user_model()(username="nobody")) == []
    assert selectors.membership_for(carol.user, "acme") is None


def test_the_workers_cross_tenant_questions(tenant_a: Tenant, tenant_b: Tenant) -> None:
    """Both tenants have a log (their creation records) and no tree: both need integrating; once
    integrated, not that, but both still need sealing (the sealer's watermark is its own). An
    export quiet for longer than the window is stale."""
    from transparency import cross_tenant, services
    from transparency.models import Export

    assert {tenant_a.pk, tenant_b.pk} <= set(cross_tenant.tenants_to_integrate())
    for tenant in (tenant_a, tenant_b):
        in_tenant(services.ensure_signing_key, tenant)
        integrate_fully(tenant)
    assert not {tenant_a.pk, tenant_b.pk} & set(cross_tenant.tenants_to_integrate())
    assert {tenant_a.pk, tenant_b.pk} <= set(cross_tenant.tenants_to_seal())

    with tenant_context(tenant_b):
        quiet = Export.objects.create(tenant=tenant_b, requested_by="test")
        Export.objects.filter(pk=quiet.pk).update(heartbeat_at=timezone.now() - timedelta(hours=2))
        Export.objects.create(tenant=tenant_b, requested_by="test")  # alive
    assert cross_tenant.stale_exports(timezone.now() - timedelta(hours=1)) == [(tenant_b.pk, quiet.pk)]


def test_the_checks_find_nothing_wrong(db: None) -> None:
    assert rls.check_runtime_role(databases=["default"]) == []


# ------------------------------------------------------------- the role checks see an unfit role


@pytest.mark.postgres
def test_connected_as_the_owner_every_check_refuses(
    transactional_db: None, client: Any, monkeypatch: Any
) -> None:
    """The owner role owns the tables (its policies do not bind it): the runtime checks name
    the problem, /readyz is not ready, and a web process serves nothing but the probes."""
    from django.core.exceptions import ImproperlyConfigured

    monkeypatch.setattr(rls.RuntimeRoleGuardMiddleware, "verified", False)
    with rls.database_owner():
        problems = rls.runtime_role_problems()
        assert (
            len(problems) == 1 and "owns tenant tables" in problems[0] and "DATABASE_OWNER_URL" in problems[0]
        )
        assert [
            message.id for message in rls.check_runtime_role(databases=["default"])
        ] == []  # migrate's own
        with pytest.raises(ImproperlyConfigured, match="owns tenant tables"):
            rls.refuse_unsafe_runtime_role()
        response = client.get("/readyz")
        assert response.status_code == 503 and "database_roles" in response.json()["failing"]
        refused = client.get("/api/v1/tenant")
        assert refused.status_code == 503 and refused.json()["error"] == "unsafe_database_role"
        assert "owns" not in refused.content.decode()  # the reasons go to the log only
        assert client.get("/healthz").status_code == 200
        assert not rls.RuntimeRoleGuardMiddleware.verified
    assert rls.runtime_role_problems() == []
    assert client.get("/readyz").json()["checks"]["database_roles"] == "ok"
    assert client.get("/api/v1/tenant").status_code in (401, 403)  # past the guard: not signed in
    assert rls.RuntimeRoleGuardMiddleware.verified


@pytest.mark.postgres
def test_migrate_again_upgrades_an_old_install_in_place(transactional_db: None, tenant_a: Tenant) -> None:
    """An install from before the owner role (FORCEd, the bypass setting in the policy) is
    brought to today's policy by the next migrate, as the owner; the runtime role keeps working."""
    from django.core.management import call_command

    table = connection.ops.quote_name(ApiKey._meta.db_table)
    legacy = (
        "tenant_id = NULLIF(current_setting('sagaplane.tenant_id', true), '')::bigint "
        "OR current_setting('sagaplane.bypass_rls', true) = 'on'"
    )
    with rls.database_owner(), connection.cursor() as cursor:
        cursor.execute(f"ALTER TABLE {table} FORCE ROW LEVEL SECURITY")
        cursor.execute(f"ALTER POLICY tenant_isolation ON {table} USING ({legacy}) WITH CHECK ({legacy})")
    call_command("migrate", verbosity=0)

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relforcerowsecurity, pg_get_expr(p.polqual, p.polrelid), "
            "pg_get_expr(p.polwithcheck, p.polrelid) "
            "FROM pg_class c JOIN pg_policy p ON p.polrelid = c.oid WHERE c.oid = to_regclass(%s)",
            [ApiKey._meta.db_table],
        )
        forced, using, check = cursor.fetchone()
    assert not forced
    assert "sagaplane.tenant_id" in using and "bypass" not in using + check
    assert rls.runtime_role_problems() == []
    assert (
        selectors.tenant_of_api_key(
            ApiKey.prefix_of(make_person(tenant_a, "erin", Role.VIEWER).api_key) or ""
        )
        == tenant_a
    )


def _owner_url_of_the_test_database() -> str:
    from urllib.parse import quote

    db, owner = connection.settings_dict, settings.DATABASE_OWNER
    assert owner is not None
    return (
        f"postgres://{quote(owner['USER'])}:{quote(owner['PASSWORD'] or '')}"
        f"@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"
    )


@pytest.mark.postgres
@pytest.mark.parametrize("command", [["worker", "--pool=solo"], ["beat"]])
def test_a_worker_or_beat_running_as_the_owner_refuses_to_start(
    db: None, tmp_path: Any, command: list[str]
) -> None:
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_OWNER_URL", "PYTEST_CURRENT_TEST")}
    env.update(DATABASE_URL=_owner_url_of_the_test_database(), SAGAPLANE_DATA_DIR=str(tmp_path))
    result = subprocess.run(
        [str(Path(sys.executable).parent / "celery"), "-A", "controlplane", *command, "-l", "WARNING"],
        cwd=Path(__file__).resolve().parents[2],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0
    assert "unsafe database role" in result.stderr and "owns tenant tables" in result.stderr, result.stderr[
        -2000:
    ]


def test_migrate_on_postgres_needs_the_owner_url(db: None, settings: Any) -> None:
    from django.core.management import CommandError

    settings.DATABASE_OWNER = None
    if connection.vendor != "postgresql":
        with rls.database_owner():  # nothing to swap on SQLite
            assert connection.vendor == "sqlite"
        return
    with pytest.raises(CommandError, match="DATABASE_OWNER_URL"), rls.database_owner():
        pass


def test_a_new_person_can_be_looked_up(tenant_a: Tenant) -> None:
    dave = make_person(tenant_a, "dave", Role.VIEWER)
    assert [m.tenant for m in selectors.memberships_of(dave.user)] == [tenant_a]
    assert selectors.tenant_of_api_key(ApiKey.prefix_of(dave.api_key) or "") == tenant_a


# ------------------------------------------------------------------ DATABASE_OWNER_URL at start-up


def test_the_owner_url_must_be_another_role_on_the_same_database(tmp_path: Any) -> None:
    from tests.support.settings_check import manage_check, refused_to_start

    runtime = "postgres://app:hunter2runtime@db.internal:5432/sagaplane"
    same = "same host, port and database as DATABASE_URL"
    refusals = {
        "postgres://owner:hunter2owner@db.internal:5432/elsewhere": same,
        "postgres://owner:hunter2owner@db.other:5432/sagaplane": same,
        "postgres://app:hunter2owner@db.internal:5432/sagaplane": "another role than DATABASE_URL's",
        "mysql://owner:hunter2owner@db.internal:3306/sagaplane": "a URL starting postgres:// or postgresql://",
    }
    for owner, problem in refusals.items():
        result = manage_check(tmp_path, DATABASE_URL=runtime, DATABASE_OWNER_URL=owner)
        refused_to_start(result, "DATABASE_OWNER_URL must be", problem)
        assert "hunter2" not in result.stderr
    embedded = manage_check(
        tmp_path, DATABASE_OWNER_URL="postgres://owner:hunter2owner@db.internal:5432/sagaplane"
    )
    refused_to_start(embedded, "DATABASE_OWNER_URL must be set only when DATABASE_URL is a postgres:// URL")
    fine = manage_check(
        tmp_path,
        DATABASE_URL=runtime,
        DATABASE_OWNER_URL="postgresql://owner:hunter2owner@db.internal:5432/sagaplane",
    )
    assert fine.returncode == 0, fine.stderr
