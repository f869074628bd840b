"""The passkey pages: a member registers, renames and revokes their own passkeys over HTTP, sees
only theirs, and cannot touch anyone else's."""

from __future__ import annotations

import json

import pytest
from django.test import Client

from passkeys import services
from passkeys.models import Passkey
from tests.passkeys.authenticator import SoftAuthenticator
from tests.support.chains import server_stream
from tests.support.factories import Person

pytestmark = pytest.mark.django_db


def browser_of(person: Person) -> Client:
    client = Client(HTTP_HOST="localhost:8000")
    client.force_login(person.user)
    return client


def register(client: Client, name: str, auth: SoftAuthenticator) -> dict:
    options = client.post("/account/passkeys/options").json()
    answer = client.post(
        "/account/passkeys/register", {"name": name, "credential": json.dumps(auth.create(options))}
    )
    return {"status": answer.status_code, **answer.json()}


def test_a_member_manages_their_own_passkeys_from_the_page(alice: Person, bob: Person) -> None:
    alices, bobs = browser_of(alice), browser_of(bob)
    assert register(alices, "YubiKey 5", SoftAuthenticator())["status"] == 201
    assert register(bobs, "bob's phone", SoftAuthenticator())["status"] == 201
    refused = register(alices, "", SoftAuthenticator())
    assert (refused["status"], refused["error"], refused["field"]) == (400, "invalid_name", "name")

    page = alices.get("/account/passkeys/").content.decode()
    assert "YubiKey 5" in page and "bob&#x27;s phone" not in page and "bob's phone" not in page
    assert 'id="passkey-register-form"' in page

    mine = Passkey.objects.get(name="YubiKey 5")
    theirs = Passkey.objects.get(name="bob's phone")
    # Bob cannot rename or revoke Alice's passkey: told so, nothing changes, nothing is recorded.
    before = len(server_stream(alice.tenant))
    for path, data in (("rename", {"passkey": mine.pk, "name": "pwned"}), ("revoke", {"passkey": mine.pk})):
        answer = bobs.post(f"/account/passkeys/{path}", data, follow=True)
        assert b"no such passkey of yours" in answer.content
    assert bobs.post("/account/passkeys/revoke", {"passkey": "x" * 30}).status_code == 302
    mine.refresh_from_db()
    assert (mine.name, mine.revoked_at) == ("YubiKey 5", None)
    assert len(server_stream(alice.tenant)) == before

    alices.post("/account/passkeys/rename", {"passkey": mine.pk, "name": "desk key"})
    answer = alices.post("/account/passkeys/revoke", {"passkey": mine.pk}, follow=True)
    assert b"revoked: it signs nothing from now on" in answer.content
    mine.refresh_from_db()
    assert mine.name == "desk key" and mine.revoked_at is not None
    assert services.live_passkeys(bob.user) == [theirs]
    # The revoked passkey no longer keeps the authenticator from registering anew.
    options = alices.post("/account/passkeys/options").json()
    assert options["excludeCredentials"] == []


def test_the_sign_in_page_offers_a_passkey(alice: Person) -> None:
    page = Client().get("/login/").content.decode()
    assert "Sign in with a passkey" in page and 'data-options-url="/login/passkey/options"' in page
