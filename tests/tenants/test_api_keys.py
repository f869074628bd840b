from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from core.scoping import tenant_context
from tenants import services
from tenants.actors import named_actor
from tenants.inputs import NewApiKey
from tenants.models import ApiKey, Tenant, hash_api_key
from tests.support.factories import Person
from tests.support.scoping import in_tenant

pytestmark = pytest.mark.smoke


def _status_and_code(client, url: str = "/api/v1/tenant") -> tuple[int, str | None]:
    response = client.get(url)
    body = response.json()
    return response.status_code, body.get("error")


def test_valid_key_names_its_tenant(alice: Person) -> None:
    response = alice.key_client().get("/api/v1/tenant")
    assert response.status_code == 200
    assert response.json()["tenant"]["slug"] == "acme"
    assert response.json()["scopes"] == sorted(["ingest", "gate", "read", "recovery", "audit", "control"])


def test_missing_key_is_401(db: None) -> None:
    from rest_framework.test import APIClient

    assert _status_and_code(APIClient()) == (401, "not_authenticated")


@pytest.mark.parametrize("raw", ["nonsense", "sp_short_x", "sp_abcdefghijkl_wrongsecret"])
def test_wrong_key_is_401(alice: Person, raw: str) -> None:
    from rest_framework.test import APIClient

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert _status_and_code(client) == (401, "invalid_api_key")


def test_right_prefix_wrong_secret_is_401(alice: Person) -> None:
    from rest_framework.test import APIClient

    prefix = ApiKey.prefix_of(alice.api_key)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer sp_{prefix}_{'x' * 43}")
    assert _status_and_code(client) == (401, "invalid_api_key")


def test_revoked_key_is_401(alice: Person, tenant_a: Tenant) -> None:
    with tenant_context(tenant_a):
        key = ApiKey.objects.get(prefix=ApiKey.prefix_of(alice.api_key))
    with tenant_context(tenant_a):
        services.revoke_api_key(key, actor=named_actor("test"))
    assert _status_and_code(alice.key_client()) == (401, "revoked_api_key")


def test_expired_key_is_401(alice: Person, tenant_a: Tenant) -> None:
    with tenant_context(tenant_a):
        ApiKey.objects.filter(prefix=ApiKey.prefix_of(alice.api_key)).update(
            expires_at=timezone.now() - timedelta(seconds=1)
        )
    assert _status_and_code(alice.key_client()) == (401, "expired_api_key")


def test_missing_scope_is_403(tenant_a: Tenant) -> None:
    from rest_framework.test import APIClient

    _, raw = in_tenant(
        services.create_api_key,
        tenant_a,
        NewApiKey(name="ingest-only", scopes=["ingest"]),
        actor=named_actor("test"),
    )
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert _status_and_code(client) == (403, "missing_scope")


def test_stored_value_is_a_hash_never_the_key(alice: Person, tenant_a: Tenant) -> None:
    with tenant_context(tenant_a):
        key = ApiKey.objects.get(prefix=ApiKey.prefix_of(alice.api_key))
        row = ApiKey.objects.values_list("key_hash", "prefix", "name").get(pk=key.pk)
        stored_values = [str(v) for v in row]
    assert alice.api_key not in stored_values
    assert key.key_hash == hash_api_key(alice.api_key)
    assert alice.api_key.split("_", 2)[2] not in "".join(stored_values)


def test_last_used_is_recorded(alice: Person, tenant_a: Tenant) -> None:
    alice.key_client().get("/api/v1/tenant")
    with tenant_context(tenant_a):
        key = ApiKey.objects.get(prefix=ApiKey.prefix_of(alice.api_key))
    assert key.last_used_at is not None


def test_owner_creates_key_shown_once_viewer_cannot(alice: Person, bob: Person) -> None:
    response = alice.session_client().post(
        "/api/v1/keys", {"name": "ci-agent", "scopes": ["ingest"]}, format="json"
    )
    assert response.status_code == 201, response.content
    raw = response.json()["key"]
    assert raw.startswith("sp_")
    listing = alice.session_client().get("/api/v1/keys").json()
    assert raw not in str(listing)
    assert any(item["name"] == "ci-agent" for item in listing["results"])
    denied = bob.session_client().post("/api/v1/keys", {"name": "x", "scopes": ["ingest"]}, format="json")
    assert denied.status_code == 403 and denied.json()["error"] == "role_forbidden"


def test_bad_scope_is_400_naming_the_field(alice: Person) -> None:
    response = alice.session_client().post("/api/v1/keys", {"name": "x", "scopes": ["root"]}, format="json")
    assert response.status_code == 400
    assert response.json() == {
        "error": "invalid_scope",
        "detail": "scopes must be a non-empty subset of ingest, gate, read, recovery, audit, control",
        "field": "scopes",
    }


def test_revoke_through_api(alice: Person, tenant_a: Tenant) -> None:
    client = alice.session_client()
    created = client.post("/api/v1/keys", {"name": "temp", "scopes": ["read"]}, format="json").json()
    assert client.delete(f"/api/v1/keys/{created['id']}").status_code == 204
    from rest_framework.test import APIClient

    agent = APIClient()
    agent.credentials(HTTP_AUTHORIZATION=f"Bearer {created['key']}")
    assert _status_and_code(agent) == (401, "revoked_api_key")


def test_revoked_key_is_refused_at_once_even_just_after_use(alice: Person, tenant_a: Tenant) -> None:
    client = alice.key_client()
    assert _status_and_code(client)[0] == 200  # remembered as checked now
    with tenant_context(tenant_a):
        key = ApiKey.objects.get(prefix=ApiKey.prefix_of(alice.api_key))
    with tenant_context(tenant_a):
        services.revoke_api_key(key, actor=named_actor("test"))  # the revoking process forgets it
    assert _status_and_code(client) == (401, "revoked_api_key")


def test_a_key_revoked_by_another_process_is_refused_within_the_bound(
    alice: Person, tenant_a: Tenant, monkeypatch: pytest.MonkeyPatch
) -> None:
    from core import epoch
    from tenants import authentication

    now = [1000.0]
    monkeypatch.setattr(authentication.time, "monotonic", lambda: now[0])
    client = alice.key_client()
    assert _status_and_code(client)[0] == 200
    with tenant_context(tenant_a):  # a change that skipped the hold (revoke_api_key's), from here
        ApiKey.objects.filter(prefix=ApiKey.prefix_of(alice.api_key)).update(revoked_at=timezone.now())
    now[0] += epoch.MAX_AGE_S
    assert _status_and_code(client) == (401, "revoked_api_key")


def test_a_key_revoked_in_another_process_is_refused_on_the_next_request_there(
    alice: Person, tenant_a: Tenant, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tenants import authentication

    monkeypatch.setattr(authentication.time, "monotonic", lambda: 1000.0)  # no copy ever ages out
    client = alice.key_client()
    assert _status_and_code(client)[0] == 200
    assert _status_and_code(client)[0] == 200  # from this process' copy of the row
    prefix = ApiKey.prefix_of(alice.api_key) or ""
    assert prefix in authentication._held
    with tenant_context(tenant_a):
        key = ApiKey.objects.get(prefix=prefix)
    with tenant_context(tenant_a):
        services.revoke_api_key(
            key, actor=named_actor("test")
        )  # touches no process' memory: the tenant's hold
    assert prefix in authentication._held
    assert _status_and_code(client) == (401, "revoked_api_key")


def test_a_revocation_whose_hold_fails_answers_once_every_copy_has_aged_out(
    alice: Person, tenant_a: Tenant, monkeypatch: pytest.MonkeyPatch, django_capture_on_commit_callbacks: Any
) -> None:
    import time

    from django.core.cache import cache

    from core import epoch

    now = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    monkeypatch.setattr(time, "sleep", lambda seconds: now.__setitem__(0, now[0] + seconds))
    client = alice.key_client()
    assert _status_and_code(client)[0] == 200  # a copy, made at 1000.0

    def unreachable(*args: Any, **kwargs: Any) -> None:
        raise ConnectionError("the cache is unreachable")

    monkeypatch.setattr(cache, "set", unreachable)
    with tenant_context(tenant_a):
        key = ApiKey.objects.get(prefix=ApiKey.prefix_of(alice.api_key))
    with django_capture_on_commit_callbacks(execute=True), tenant_context(tenant_a):
        services.revoke_api_key(key, actor=named_actor("test"))
    assert now[0] >= 1000.0 + epoch.MAX_AGE_S  # the answer waited the copies out
    assert _status_and_code(client) == (401, "revoked_api_key")


def test_a_remembered_key_still_needs_its_secret_and_expires_on_time(alice: Person, tenant_a: Tenant) -> None:
    from rest_framework.test import APIClient

    client = alice.key_client()
    assert _status_and_code(client)[0] == 200
    prefix = ApiKey.prefix_of(alice.api_key)
    wrong = APIClient()
    wrong.credentials(HTTP_AUTHORIZATION=f"Bearer sp_{prefix}_{'x' * 43}")
    assert _status_and_code(wrong) == (401, "invalid_api_key")
    from tenants import authentication

    remembered = authentication._held[prefix or ""].api_key
    remembered.expires_at = timezone.now() - timedelta(seconds=1)  # expiry is checked every time
    assert _status_and_code(client) == (401, "expired_api_key")


def test_a_key_notes_its_use_once_a_minute_not_on_every_request(alice: Person) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    client = alice.key_client()
    with CaptureQueriesContext(connection) as queries:
        for _ in range(6):  # the first reads the key; the others are served from what it read
            assert _status_and_code(client)[0] == 200
    writes = [q["sql"] for q in queries if q["sql"].startswith('UPDATE "tenants_apikey" SET "last_used_at"')]
    assert len(writes) == 1, writes
