"""Every administrative action leaves one record in the tenant's server stream, written in the
action's own transaction: who acted, the old and the new values. A no-op writes nothing.
(Zulip's RealmAuditLog is the model: one row per change, with its old and new value.)"""

from __future__ import annotations

import getpass
from io import StringIO
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.test import Client
from django.urls import reverse
from sagaplane.chain import verify_chain

from core.errors import DomainError
from core.scoping import tenant_context
from frontend import invitations
from tenants import founding, services
from tenants.actors import cli_actor, user_actor
from tenants.inputs import NewApiKey
from tenants.models import Membership, Role, Tenant
from tests.support.chains import server_stream
from tests.support.factories import PASSWORD, Person
from tests.support.scoping import in_tenant
from transparency import services as transparency
from transparency.models import KeyStatus, LogSigningKey

User = get_user_model()


def new_records(tenant: Tenant, before: int) -> list[dict[str, Any]]:
    return server_stream(tenant)[before:]


def only_new_record(tenant: Tenant, before: int) -> dict[str, Any]:
    added = new_records(tenant, before)
    assert len(added) == 1, [r["event"] for r in added]
    return added[0]


def membership(tenant: Tenant, user: Any) -> Membership:
    with tenant_context(tenant):
        return Membership.objects.select_related("tenant").get(user=user)


# ------------------------------------------------------------------------------- tenants, members


def test_create_tenant_records_the_tenant_and_its_owner(db: None) -> None:
    tenant = founding.create_tenant(
        "delta", "Delta Air", "Boss@Delta.example", PASSWORD, actor=cli_actor("ops")
    )
    created, owner = server_stream(tenant)
    assert created["event"] == "ADMIN_TENANT_CREATED" and created["actor"] == "cli:ops"
    assert created["old"] is None and created["new"] == {"slug": "delta", "name": "Delta Air"}
    assert owner["event"] == "ADMIN_MEMBER_ADDED" and owner["actor"] == "cli:ops"
    assert owner["user"] == "boss@delta.example"
    assert owner["old"] is None and owner["new"] == {"role": "owner"} and owner["account_created"] is True
    assert verify_chain(server_stream(tenant)).intact


def test_create_tenant_never_changes_an_existing_accounts_password(alice: Person) -> None:
    """Defect: naming an existing person as owner of a new tenant reset their password."""
    founding.create_tenant(
        "echo", "Echo", alice.user.email.upper(), "attacker-chosen-pw", actor=cli_actor("ops")
    )
    alice.user.refresh_from_db()
    assert alice.user.check_password(PASSWORD)
    assert not alice.user.check_password("attacker-chosen-pw")
    echo = Tenant.objects.get(slug="echo")
    assert membership(echo, alice.user).role == Role.OWNER
    assert server_stream(echo)[1]["account_created"] is False


def test_add_member_with_an_existing_accounts_email_keeps_its_password(
    alice: Person, tenant_b: Tenant
) -> None:
    in_tenant(
        services.add_member,
        tenant_b,
        alice.user.email,
        Role.VIEWER,
        "another-password",
        actor=user_actor("founder"),
    )
    alice.user.refresh_from_db()
    assert alice.user.check_password(PASSWORD) and not alice.user.check_password("another-password")


def test_adding_a_member_records_who_and_the_role(tenant_a: Tenant) -> None:
    before = len(server_stream(tenant_a))
    added = in_tenant(
        services.add_member, tenant_a, "ivy@acme.example", Role.AUDITOR, PASSWORD, actor=user_actor("founder")
    )
    record = only_new_record(tenant_a, before)
    assert record["event"] == "ADMIN_MEMBER_ADDED" and record["actor"] == "user:founder"
    assert record["user"] == added.user.username == "ivy@acme.example"
    assert record["old"] is None and record["new"] == {"role": "auditor"}


def test_adding_an_existing_member_is_a_role_change_or_nothing(alice: Person, bob: Person) -> None:
    tenant = alice.tenant
    before = len(server_stream(tenant))
    in_tenant(services.add_member, tenant, bob.user.email, Role.VIEWER, actor=user_actor("alice"))
    assert new_records(tenant, before) == []
    in_tenant(services.add_member, tenant, bob.user.email, Role.APPROVER, actor=user_actor("alice"))
    record = only_new_record(tenant, before)
    assert record["event"] == "ADMIN_MEMBER_ROLE_CHANGED" and record["actor"] == "user:alice"
    assert record["user"] == bob.user.username
    assert record["old"] == {"role": "viewer"} and record["new"] == {"role": "approver"}
    assert membership(tenant, bob.user).role == Role.APPROVER


def test_changing_a_role_records_old_and_new_and_the_same_role_records_nothing(
    alice: Person, bob: Person
) -> None:
    tenant = alice.tenant
    before = len(server_stream(tenant))
    with tenant_context(tenant):
        services.change_member_role(membership(tenant, bob.user), Role.VIEWER, actor=user_actor("alice"))
    assert new_records(tenant, before) == []
    with tenant_context(tenant):
        services.change_member_role(membership(tenant, bob.user), Role.ADMIN, actor=user_actor("alice"))
    record = only_new_record(tenant, before)
    assert (record["event"], record["actor"], record["user"]) == (
        "ADMIN_MEMBER_ROLE_CHANGED",
        "user:alice",
        bob.user.username,
    )
    assert record["old"] == {"role": "viewer"} and record["new"] == {"role": "admin"}


def test_the_last_owner_is_refused_and_nothing_is_recorded(tenant_a: Tenant) -> None:
    founder = User.objects.get(email="founder@acme.example")
    before = len(server_stream(tenant_a))
    with pytest.raises(DomainError) as refused, tenant_context(tenant_a):
        services.change_member_role(membership(tenant_a, founder), Role.ADMIN, actor=user_actor("founder"))
    assert refused.value.code == "last_owner"
    with pytest.raises(DomainError) as refused, tenant_context(tenant_a):
        services.remove_member(membership(tenant_a, founder), actor=user_actor("founder"))
    assert refused.value.code == "last_owner"
    assert new_records(tenant_a, before) == []
    assert membership(tenant_a, founder).role == Role.OWNER


def test_removing_a_member_records_the_role_they_had_and_again_is_a_no_op(alice: Person, bob: Person) -> None:
    tenant = alice.tenant
    target = membership(tenant, bob.user)
    before = len(server_stream(tenant))
    with tenant_context(tenant):
        services.remove_member(target, actor=user_actor("alice"))
    record = only_new_record(tenant, before)
    assert (record["event"], record["actor"], record["user"]) == (
        "ADMIN_MEMBER_REMOVED",
        "user:alice",
        bob.user.username,
    )
    assert record["old"] == {"role": "viewer"} and record["new"] is None
    with tenant_context(tenant):
        services.remove_member(target, actor=user_actor("alice"))
    assert len(server_stream(tenant)) == before + 1


def test_the_record_is_in_the_actions_transaction(alice: Person, bob: Person, monkeypatch) -> None:
    """If the audit record cannot be written, the change does not happen either."""

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("audit store unavailable")

    monkeypatch.setattr(services, "append_server_record", refuse)
    monkeypatch.setattr(founding, "append_server_record", refuse)
    before = len(server_stream(alice.tenant))
    with pytest.raises(RuntimeError), tenant_context(alice.tenant):
        services.change_member_role(membership(alice.tenant, bob.user), Role.ADMIN, actor=user_actor("alice"))
    with pytest.raises(RuntimeError):
        in_tenant(
            services.add_member, alice.tenant, "new@acme.example", Role.VIEWER, actor=user_actor("alice")
        )
    with pytest.raises(RuntimeError):
        founding.create_tenant("foxtrot", "Foxtrot", "f@foxtrot.example", actor=cli_actor("ops"))
    assert membership(alice.tenant, bob.user).role == Role.VIEWER
    assert not User.objects.filter(email="new@acme.example").exists()
    assert not Tenant.objects.filter(slug="foxtrot").exists()
    assert len(server_stream(alice.tenant)) == before


# ------------------------------------------------------------------------------------ invitations


def _accept_url(inviter: Person, email: str, role: str) -> str:
    token = invitations.make_token(inviter.tenant, email, role, inviter.user)
    return reverse("invite-accept", args=[token])


def test_accepting_an_invitation_records_the_inviter_and_an_existing_member_records_nothing(
    alice: Person, bob: Person
) -> None:
    tenant = alice.tenant
    before = len(server_stream(tenant))
    secret = "a-long-fresh-passphrase"
    response = Client().post(
        _accept_url(alice, "jo@example.com", "approver"), {"password": secret, "password_again": secret}
    )
    assert response.status_code == 302
    record = only_new_record(tenant, before)
    assert record["event"] == "ADMIN_MEMBER_ADDED" and record["via"] == "invitation"
    assert record["actor"] == f"user:{alice.user.username} (invitation)"
    assert record["user"] == "jo@example.com"
    assert record["old"] is None and record["new"] == {"role": "approver"}

    already = Client()
    already.force_login(bob.user)
    assert already.post(_accept_url(alice, bob.user.email, "admin")).status_code == 302
    assert len(server_stream(tenant)) == before + 1
    assert membership(tenant, bob.user).role == Role.VIEWER


def test_member_pages_record_the_signed_in_actor(alice: Person, bob: Person) -> None:
    client = Client()
    client.force_login(alice.user)
    target = membership(alice.tenant, bob.user)
    before = len(server_stream(alice.tenant))
    client.post(reverse("member-role", args=[target.pk]), {"role": "auditor"})
    client.post(reverse("member-role", args=[target.pk]), {"role": "auditor"})
    client.post(reverse("member-remove", args=[target.pk]))
    changed, removed = new_records(alice.tenant, before)
    assert changed["event"] == "ADMIN_MEMBER_ROLE_CHANGED" and removed["event"] == "ADMIN_MEMBER_REMOVED"
    assert changed["actor"] == removed["actor"] == f"user:{alice.user.username}"
    assert changed["old"] == {"role": "viewer"} and changed["new"] == {"role": "auditor"}
    assert removed["old"] == {"role": "auditor"} and removed["new"] is None


# --------------------------------------------------------------------------------------- API keys


def test_api_key_creation_and_revocation_record_old_and_new(tenant_a: Tenant) -> None:
    before = len(server_stream(tenant_a))
    api_key, raw = in_tenant(
        services.create_api_key,
        tenant_a,
        NewApiKey(name="ci", scopes=["read", "ingest"]),
        actor=user_actor("x"),
    )
    created = only_new_record(tenant_a, before)
    assert created["event"] == "ADMIN_API_KEY_CREATED" and created["actor"] == "user:x"
    assert created["prefix"] == api_key.prefix and created["name"] == "ci"
    assert created["old"] is None
    assert created["new"] == {"scopes": ["ingest", "read"], "expires_at": None, "revoked_at": None}
    assert raw not in str(server_stream(tenant_a))
    with tenant_context(tenant_a):
        services.revoke_api_key(api_key, actor=user_actor("y"))
    revoked = only_new_record(tenant_a, before + 1)
    assert revoked["event"] == "ADMIN_API_KEY_REVOKED" and revoked["actor"] == "user:y"
    assert revoked["old"] == {"revoked_at": None} and revoked["new"]["revoked_at"]
    with tenant_context(tenant_a):
        services.revoke_api_key(api_key, actor=user_actor("y"))
    assert len(server_stream(tenant_a)) == before + 2


# ----------------------------------------------------------------------------- log signing keys


def _key_ids(tenant: Tenant) -> dict[str, list[str]]:
    with tenant_context(tenant):
        rows = LogSigningKey.objects.order_by("pk").values_list("key_id", "status")
        return {status: [k for k, s in rows if s == status] for status in KeyStatus.values}


def test_key_rotation_and_its_end_record_old_and_new_key_ids(tenant_a: Tenant) -> None:
    in_tenant(transparency.integrate, tenant_a)
    first = _key_ids(tenant_a)
    assert len(first["active"]) == 1
    before = len(server_stream(tenant_a))
    new_key = in_tenant(transparency.rotate_signing_key, tenant_a, actor=cli_actor("ops"))
    rotated = only_new_record(tenant_a, before)
    assert rotated["event"] == "ADMIN_SIGNING_KEY_ROTATED" and rotated["actor"] == "cli:ops"
    assert rotated["old"] == first
    assert rotated["new"] == {"active": [new_key.key_id], "retiring": first["active"], "retired": []}
    assert in_tenant(transparency.finish_key_rotation, tenant_a, actor=cli_actor("ops")) == 1
    finished = only_new_record(tenant_a, before + 1)
    assert finished["event"] == "ADMIN_SIGNING_KEY_ROTATION_FINISHED" and finished["actor"] == "cli:ops"
    assert finished["old"] == rotated["new"]
    assert finished["new"] == {"active": [new_key.key_id], "retiring": [], "retired": first["active"]}
    assert in_tenant(transparency.finish_key_rotation, tenant_a, actor=cli_actor("ops")) == 0
    assert len(server_stream(tenant_a)) == before + 2


def test_rotate_signing_key_command(tenant_a: Tenant) -> None:
    in_tenant(transparency.integrate, tenant_a)
    old = _key_ids(tenant_a)["active"]
    out = StringIO()
    call_command("rotate_signing_key", "--tenant", "acme", stdout=out)
    keys = _key_ids(tenant_a)
    assert keys["retiring"] == old and len(keys["active"]) == 1 and keys["active"] != old
    assert keys["active"][0] in out.getvalue()
    record = server_stream(tenant_a)[-1]
    assert record["event"] == "ADMIN_SIGNING_KEY_ROTATED" and record["actor"] == f"cli:{getpass.getuser()}"
    call_command("rotate_signing_key", "--tenant", "acme", "--finish", stdout=StringIO())
    assert _key_ids(tenant_a)["retired"] == old
    assert server_stream(tenant_a)[-1]["event"] == "ADMIN_SIGNING_KEY_ROTATION_FINISHED"
    with pytest.raises(CommandError, match="tenant"):
        call_command("rotate_signing_key", "--tenant", "nope", stdout=StringIO())


def test_cli_commands_name_the_operator(db: None) -> None:
    call_command(
        "create_tenant", "golf", "--name", "Golf", "--owner-email", "g@golf.example", stdout=StringIO()
    )
    golf = Tenant.objects.get(slug="golf")
    call_command("create_api_key", "--tenant", "golf", "--name", "bot", stdout=StringIO())
    events = [(r["event"], r["actor"]) for r in server_stream(golf)]
    operator = f"cli:{getpass.getuser()}"
    assert events == [
        ("ADMIN_TENANT_CREATED", operator),
        ("ADMIN_MEMBER_ADDED", operator),
        ("ADMIN_API_KEY_CREATED", operator),
    ]
