"""Layout, security headers, tenant switching."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from tenants import services
from tenants.actors import named_actor
from tenants.models import Role
from tests.support.factories import Person
from tests.support.scoping import in_tenant


def browser(person: Person) -> Client:
    client = Client()
    client.force_login(person.user)
    return client


@pytest.mark.parametrize("name", ["sagas", "fleet", "evidence", "members", "keys", "login"])
def test_strict_csp_and_no_inline_script_or_style(alice: Person, name: str) -> None:
    response = browser(alice).get(reverse(name)) if name != "login" else Client().get(reverse("login"))
    assert response.status_code == 200
    csp = response["Content-Security-Policy"]
    assert "unsafe-inline" not in csp and "unsafe-eval" not in csp
    assert "script-src 'self'" in csp and "style-src 'self'" in csp
    body = response.content.decode()
    assert "<script>" not in body and "<script type" not in body.replace("<script src", "")
    assert "style=" not in body and "<style" not in body and " on" + "click=" not in body


def test_navigation_follows_role(alice: Person, bob: Person) -> None:
    owner = browser(alice).get(reverse("sagas")).content.decode()
    viewer = browser(bob).get(reverse("sagas")).content.decode()
    for label in ("Sagas", "Fleet", "Evidence", "Administration"):
        assert f">{label}</a>" in owner
    assert ">Sagas</a>" in viewer and ">Fleet</a>" in viewer
    assert ">Evidence</a>" not in viewer and ">Administration</a>" not in viewer
    assert browser(bob).get(reverse("evidence")).status_code == 403


def test_home_redirects_to_sagas(alice: Person) -> None:
    assert browser(alice).get("/")["Location"] == reverse("sagas")


def test_tenant_switcher(alice: Person, carol: Person, tenant_b) -> None:
    in_tenant(services.add_member, tenant_b, alice.user.email, Role.VIEWER, actor=named_actor("test"))
    client = browser(alice)
    page = client.get(reverse("sagas")).content.decode()
    assert 'id="tenant-switch"' in page and "Bravo Logistics" in page
    assert client.post(reverse("switch-tenant"), {"tenant": "bravo"}).status_code == 302
    assert client.get(reverse("keys")).status_code == 403  # a viewer in bravo
    assert client.post(reverse("switch-tenant"), {"tenant": "nope"}).status_code == 404


def test_someone_with_no_tenant_gets_404(db: None) -> None:
    from django.contrib.auth import get_user_model

    user = get_user_model().objects.create_user("loner", "loner@example.com", "x" * 12)
    client = Client()
    client.force_login(user)
    assert client.get(reverse("sagas")).status_code == 404


def test_sign_in_with_email_and_password(alice: Person) -> None:
    from tests.support.factories import PASSWORD

    client = Client()
    response = client.post(reverse("login"), {"username": alice.user.username, "password": PASSWORD})
    assert response.status_code == 302
    assert client.get(reverse("sagas")).status_code == 200


def test_times_are_relative_with_absolute_title(alice: Person) -> None:
    from datetime import datetime
    from zoneinfo import ZoneInfo

    from core.scoping import tenant_context
    from tenants.models import ApiKey

    # A key made at a known moment, given in Berlin time (UTC+1 that day): shown in UTC.
    made = datetime(2024, 3, 5, 9, 8, 9, tzinfo=ZoneInfo("Europe/Berlin"))
    with tenant_context(alice.tenant):
        assert ApiKey.objects.filter(name="alice-agent").update(created_at=made) == 1
    body = browser(alice).get(reverse("keys")).content.decode()
    element = '<time datetime="2024-03-05T08:08:09+00:00" title="2024-03-05 08:08:09 UTC" data-relative>'
    assert body.count(element) == 1
    text = body.split(element, 1)[1].split("</time>", 1)[0]
    assert text.endswith(" ago") and text[0].isdigit(), text  # e.g. "2 years ago", kept current by app.js
