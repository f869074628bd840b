"""Sign-in throttling (django-axes): failures are counted per account from any address and per
address across accounts; past the limit every sign-in they cover is refused with 429, the right
password included, until the cool-off has passed. Never a 5xx, and the page says why."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.db.models import F
from django.test import AsyncClient, Client

from tests.support.factories import PASSWORD, Person

pytestmark = pytest.mark.django_db

LIMIT = 3


@pytest.fixture(autouse=True)
def _small_limit(settings: Any) -> None:
    settings.AXES_FAILURE_LIMIT = LIMIT


def _sign_in(email: str, password: str, address: str, **headers: str) -> tuple[int, bool, Any]:
    """(status, whether the client is now signed in, response) for one sign-in from `address`."""
    client = Client(REMOTE_ADDR=address)
    response = client.post("/login/", {"username": email, "password": password}, headers=headers)
    return response.status_code, "_auth_user_id" in client.session, response


def test_the_right_password_works_below_the_limit(alice: Person) -> None:
    for _n in range(LIMIT - 1):
        assert _sign_in(alice.user.email, "wrong-password", "10.0.0.1")[:2] == (200, False)
    assert _sign_in(alice.user.email, PASSWORD, "10.0.0.1")[:2] == (302, True)


def test_wrong_passwords_lock_the_account_from_every_address(alice: Person, bob: Person) -> None:
    # Each guess from another address: only the per-account count can catch this.
    for n in range(LIMIT):
        status, signed_in, _ = _sign_in(alice.user.email, "wrong-password", f"10.0.1.{n}")
        assert (status, signed_in) == (429 if n == LIMIT - 1 else 200, False)
    # The right password, from a fresh address and spelt in capitals, is refused too.
    assert _sign_in(alice.user.email, PASSWORD, "10.0.2.1")[:2] == (429, False)
    assert _sign_in(alice.user.email.upper(), PASSWORD, "10.0.2.2")[:2] == (429, False)
    # The lock is on the account, not on those addresses: someone else signs in from them.
    assert _sign_in(bob.user.email, PASSWORD, "10.0.1.0")[:2] == (302, True)


def test_one_address_trying_many_accounts_is_locked(alice: Person, bob: Person) -> None:
    for n in range(LIMIT):
        _sign_in(f"guess-{n}@acme.example", "wrong-password", "10.0.3.1")
    # Even a real account with its right password is refused from that address...
    assert _sign_in(bob.user.email, PASSWORD, "10.0.3.1")[:2] == (429, False)
    # ...while the account itself is not locked: from elsewhere it signs in.
    assert _sign_in(bob.user.email, PASSWORD, "10.0.3.2")[:2] == (302, True)


def test_the_lockout_lasts_until_the_cool_off_has_passed(alice: Person, settings: Any) -> None:
    from axes.models import AccessAttempt

    for _n in range(LIMIT):
        _sign_in(alice.user.email, "wrong-password", "10.0.4.1")
    assert _sign_in(alice.user.email, PASSWORD, "10.0.4.2")[:2] == (429, False)
    # A minute short of the cool-off since the last failure: still locked (the refused attempts
    # checked no password, so they are not failures and do not extend it).
    almost = settings.AXES_COOLOFF_TIME - timedelta(minutes=1)
    AccessAttempt.objects.update(attempt_time=F("attempt_time") - almost)
    assert _sign_in(alice.user.email, PASSWORD, "10.0.4.3")[:2] == (429, False)
    # The cool-off passed with no further failure: the right password signs in again.
    late = timedelta(minutes=2)
    AccessAttempt.objects.update(attempt_time=F("attempt_time") - late)
    assert _sign_in(alice.user.email, PASSWORD, "10.0.4.4")[:2] == (302, True)


def test_the_lockout_answer_says_why_as_html_or_json(alice: Person, settings: Any) -> None:
    for _n in range(LIMIT):
        _sign_in(alice.user.email, "wrong-password", "10.0.5.1")
    minutes = int(settings.AXES_COOLOFF_TIME.total_seconds() // 60)

    status, _, page = _sign_in(alice.user.email, PASSWORD, "10.0.5.1")
    assert status == 429 and page["Retry-After"] == str(minutes * 60)
    assert page["Content-Type"].startswith("text/html")
    assert f"Too many failed sign-ins. Try again in {minutes} minutes." in page.content.decode()

    status, _, answer = _sign_in(alice.user.email, PASSWORD, "10.0.5.1", Accept="application/json")
    assert status == 429
    assert answer.json() == {
        "error": "locked_out",
        "detail": f"too many failed sign-ins; try again in {minutes} minutes",
        "retry_after": minutes * 60,
    }


def test_the_async_stack_answers_the_same(alice: Person) -> None:
    """Under ASGI (the production server) axes' middleware takes its async path."""

    async def scenario() -> list[int]:
        client = AsyncClient(REMOTE_ADDR="10.0.6.1")
        statuses = []
        for password in ["wrong-password"] * LIMIT + [PASSWORD]:
            response = await client.post("/login/", {"username": alice.user.email, "password": password})
            statuses.append(response.status_code)
        return statuses

    assert async_to_sync(scenario)() == [200] * (LIMIT - 1) + [429, 429]
