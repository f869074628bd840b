"""Administration pages: members (invite, change role, remove) and API keys, by role."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.urls import reverse

from core.scoping import tenant_context
from frontend import invitations
from tenants.actors import named_actor
from tenants.models import ApiKey, Membership, Role, Tenant
from tests.support.factories import Person


def browser(person: Person) -> Client:
    client = Client()
    client.force_login(person.user)
    return client


def membership_of(person: Person) -> Membership:
    with tenant_context(person.tenant):
        return Membership.objects.get(user=person.user)


@pytest.mark.parametrize("name", ["members", "keys"])
def test_owner_sees_administration(alice: Person, name: str) -> None:
    response = browser(alice).get(reverse(name))
    assert response.status_code == 200
    assert b"Administration" in response.content


@pytest.mark.parametrize("name", ["members", "keys"])
def test_viewer_gets_403_and_no_navigation_to_it(bob: Person, name: str) -> None:
    client = browser(bob)
    response = client.get(reverse(name))
    assert response.status_code == 403
    assert b"Not allowed" in response.content
    assert ApiKey.prefix_of(bob.api_key).encode() not in response.content
    sagas = client.get(reverse("sagas"))
    assert sagas.status_code == 200
    assert b'href="/administration/' not in sagas.content


def test_viewer_cannot_create_or_revoke_keys(alice: Person, bob: Person) -> None:
    client = browser(bob)
    assert client.post(reverse("key-create"), {"name": "x", "scopes": ["read"]}).status_code == 403
    with tenant_context(alice.tenant):
        key = ApiKey.objects.get(prefix=ApiKey.prefix_of(alice.api_key))
        count = ApiKey.objects.count()
    assert client.post(reverse("key-revoke", args=[key.pk])).status_code == 403
    with tenant_context(alice.tenant):
        assert ApiKey.objects.count() == count
        key.refresh_from_db()
        assert key.revoked_at is None


def test_login_required(db: None) -> None:
    for name in ("members", "keys", "sagas", "fleet", "evidence"):
        response = Client().get(reverse(name))
        assert response.status_code == 302 and response["Location"].startswith("/login/")


def test_create_key_shows_it_once_and_it_works(alice: Person) -> None:
    client = browser(alice)
    response = client.post(reverse("key-create"), {"name": "ci-agent", "scopes": ["ingest", "read"]})
    assert response.status_code == 200
    assert response["Cache-Control"] == "no-store"
    found = re.search(rb'id="new-key-value" class="secret">(sp_[A-Za-z0-9_-]+)<', response.content)
    raw = found.group(1).decode()
    with tenant_context(alice.tenant):
        key = ApiKey.objects.get(prefix=ApiKey.prefix_of(raw))
        assert key.scopes == ["ingest", "read"] and key.created_by == alice.user
    # Listed afterwards by prefix only, never in full.
    listing = client.get(reverse("keys")).content
    assert key.prefix.encode() in listing and raw.encode() not in listing
    api = Client(HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert api.get("/api/v1/tenant").status_code in (200, 404)


def test_create_key_needs_a_scope(alice: Person) -> None:
    response = browser(alice).post(reverse("key-create"), {"name": "nothing"})
    assert response.status_code == 200 and b"new-key-value" not in response.content
    assert b"This field is required" in response.content


def test_revoke_key(alice: Person) -> None:
    with tenant_context(alice.tenant):
        key = ApiKey.objects.get(prefix=ApiKey.prefix_of(alice.api_key))
    response = browser(alice).post(reverse("key-revoke", args=[key.pk]))
    assert response.status_code == 302
    with tenant_context(alice.tenant):
        key.refresh_from_db()
    assert key.revoked_at is not None
    assert Client(HTTP_AUTHORIZATION=f"Bearer {alice.api_key}").get("/api/v1/tenant").status_code == 401


def test_carol_cannot_touch_acme_keys_or_members(alice: Person, bob: Person, carol: Person) -> None:
    with tenant_context(alice.tenant):
        key = ApiKey.objects.get(prefix=ApiKey.prefix_of(alice.api_key))
    bob_membership = membership_of(bob)
    client = browser(carol)
    assert client.post(reverse("key-revoke", args=[key.pk])).status_code == 404
    assert client.post(reverse("member-role", args=[bob_membership.pk]), {"role": "owner"}).status_code == 404
    assert client.post(reverse("member-remove", args=[bob_membership.pk])).status_code == 404
    with tenant_context(alice.tenant):
        key.refresh_from_db()
        assert key.revoked_at is None
        assert Membership.objects.get(pk=bob_membership.pk).role == Role.VIEWER
    for name in ("members", "keys"):
        body = client.get(reverse(name)).content.decode()
        for fingerprint in (alice.tenant.name, alice.user.email, bob.user.email, key.prefix):
            assert fingerprint not in body


def test_change_role_and_remove(alice: Person, bob: Person) -> None:
    client = browser(alice)
    target = membership_of(bob)
    assert client.post(reverse("member-role", args=[target.pk]), {"role": "auditor"}).status_code == 302
    assert membership_of(bob).role == Role.AUDITOR
    assert client.post(reverse("member-remove", args=[target.pk])).status_code == 302
    with tenant_context(alice.tenant):
        assert not Membership.objects.filter(user=bob.user).exists()


def test_last_owner_cannot_be_demoted_or_removed(tenant_a: Tenant, alice: Person) -> None:
    client = browser(alice)
    with tenant_context(tenant_a):
        founder = Membership.objects.get(user__email="founder@acme.example")
    # Two owners: the founder can go.
    assert client.post(reverse("member-remove", args=[founder.pk])).status_code == 302
    me = membership_of(alice)
    response = client.post(reverse("member-role", args=[me.pk]), {"role": "viewer"}, follow=True)
    assert b"at least one owner" in response.content
    assert membership_of(alice).role == Role.OWNER
    client.post(reverse("member-remove", args=[me.pk]))
    assert membership_of(alice).role == Role.OWNER


def test_admin_cannot_make_or_unmake_owners(tenant_a: Tenant, alice: Person, bob: Person) -> None:
    from tenants import services

    with tenant_context(bob.tenant):
        services.change_member_role(membership_of(bob), Role.ADMIN, actor=named_actor("test"))
    client = browser(bob)
    client.post(reverse("member-role", args=[membership_of(bob).pk]), {"role": "owner"})
    assert membership_of(bob).role == Role.ADMIN
    client.post(reverse("member-role", args=[membership_of(alice).pk]), {"role": "viewer"})
    assert membership_of(alice).role == Role.OWNER
    response = client.post(reverse("member-invite"), {"email": "x@example.com", "role": "owner"})
    assert b"only an owner can invite an owner" in response.content


def _invite(client: Client, email: str, role: str) -> str:
    response = client.post(reverse("member-invite"), {"email": email, "role": role})
    assert response.status_code == 200
    found = re.search(rb'id="invite-url" class="secret">http://testserver(/invite/[^<]+)<', response.content)
    return found.group(1).decode()


def test_invitation_creates_account_and_membership(alice: Person) -> None:
    path = _invite(browser(alice), "dora@example.com", "auditor")
    guest = Client()
    page = guest.get(path)
    assert page.status_code == 200 and b"Acme Payments" in page.content
    secret = "a-long-fresh-passphrase"
    response = guest.post(path, {"password": secret, "password_again": secret})
    assert response.status_code == 302
    user = get_user_model().objects.get(email="dora@example.com")
    assert user.check_password("a-long-fresh-passphrase")
    with tenant_context(alice.tenant):
        assert Membership.objects.get(user=user).role == Role.AUDITOR
    # Signed in and acting for acme now.
    assert guest.get(reverse("evidence")).status_code == 200


def test_invitation_is_emailed_with_its_link(alice: Person, mailoutbox: list) -> None:
    path = _invite(browser(alice), "hana@example.com", "approver")
    assert len(mailoutbox) == 1
    message = mailoutbox[0]
    assert message.to == ["hana@example.com"] and "Acme Payments" in message.subject
    assert f"http://testserver{path}" in message.body and "approver" in message.body


def test_invitation_works_once_so_a_removed_member_cannot_rejoin(alice: Person) -> None:
    from tenants import services

    path = _invite(browser(alice), "gina@example.com", "viewer")
    guest = Client()
    secret = "a-long-fresh-passphrase"
    assert guest.post(path, {"password": secret, "password_again": secret}).status_code == 302
    gina = get_user_model().objects.get(email="gina@example.com")
    with tenant_context(alice.tenant):
        services.remove_member(Membership.objects.get(user=gina), actor=named_actor("test"))
    guest.force_login(gina)
    assert guest.get(path).status_code == 410
    assert guest.post(path).status_code == 410
    with tenant_context(alice.tenant):
        assert not Membership.objects.filter(user=gina).exists()


def test_invitation_for_existing_account_needs_its_sign_in(alice: Person, carol: Person) -> None:
    path = _invite(browser(alice), carol.user.email, "viewer")
    assert b"Sign in to accept" in Client().get(path).content
    carol_client = browser(carol)
    assert carol_client.post(path).status_code == 302
    with tenant_context(alice.tenant):
        assert Membership.objects.get(user=carol.user).role == Role.VIEWER


def test_tampered_or_expired_invitation_is_refused(alice: Person, settings) -> None:
    path = _invite(browser(alice), "eve@example.com", "viewer")
    assert Client().get(path[:-3] + "abc").status_code == 410
    token = path.rsplit("/", 1)[1]
    from datetime import timedelta
    from unittest import mock

    with mock.patch.object(invitations, "INVITATION_MAX_AGE", timedelta(seconds=-1)):
        assert Client().get(path).status_code == 410
    assert invitations.read_token(token).email == "eve@example.com"


def test_invitation_dies_with_the_inviters_rights(alice: Person, bob: Person) -> None:
    from tenants import services

    with tenant_context(bob.tenant):
        services.change_member_role(membership_of(bob), Role.ADMIN, actor=named_actor("test"))
    path = _invite(browser(bob), "frank@example.com", "viewer")
    with tenant_context(bob.tenant):
        services.change_member_role(membership_of(bob), Role.VIEWER, actor=named_actor("test"))
    assert Client().get(path).status_code == 410


def test_csrf_is_enforced(alice: Person) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(alice.user)
    response = client.post(reverse("key-create"), {"name": "x", "scopes": ["read"]})
    assert response.status_code == 403
    page = client.get(reverse("keys"))
    token = re.search(rb'name="csrfmiddlewaretoken" value="([^"]+)"', page.content).group(1).decode()
    ok = client.post(reverse("key-create"), {"name": "x", "scopes": ["read"], "csrfmiddlewaretoken": token})
    assert ok.status_code == 200 and b"new-key-value" in ok.content


def test_member_changes_are_in_the_audit_stream(alice: Person, bob: Person) -> None:
    from audit.models import Record

    client = browser(alice)
    target = membership_of(bob)
    client.post(reverse("member-role", args=[target.pk]), {"role": "auditor"})
    client.post(reverse("member-remove", args=[target.pk]))
    path = _invite(client, "gina@example.com", "viewer")
    Client().post(path, {"password": "a-long-fresh-passphrase", "password_again": "a-long-fresh-passphrase"})
    with tenant_context(alice.tenant):
        events = list(Record.objects.filter(stream__stream_id="server").values_list("event", flat=True))
    for event in ("ADMIN_MEMBER_ROLE_CHANGED", "ADMIN_MEMBER_REMOVED", "ADMIN_MEMBER_ADDED"):
        assert event in events
