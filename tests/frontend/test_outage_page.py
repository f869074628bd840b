"""A console page that meets an unreachable store answers a 503 page that says so and asks to retry
(`frontend.errors.server_error`, the URLconf's handler500), marking the store down as an API call
would; any other unexpected error is still Django's own 500."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from django.db import OperationalError
from django.test import Client

from core import availability
from frontend import views
from tests.support.factories import Person

pytestmark = pytest.mark.django_db


def _unreachable() -> OperationalError:
    """As Django raises a refused connection: its own class, the driver's as the cause."""
    try:
        raise psycopg.OperationalError("connection refused")
    except psycopg.OperationalError as driver:
        error = OperationalError(str(driver))
        error.__cause__ = driver
        return error


@pytest.fixture
def signed_in(alice: Person) -> Iterator[Client]:
    client = Client(raise_request_exception=False)
    client.force_login(alice.user)
    yield client
    availability.reset()  # the page marked the database down; the next test starts with it up


def test_a_page_that_cannot_reach_the_database_says_so(
    signed_in: Client, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def refused(_request: object) -> object:
        raise _unreachable()

    monkeypatch.setattr(views, "_membership_or_404", refused)
    response = signed_in.get("/recovery/")
    assert response.status_code == 503
    assert response["Retry-After"] == "1"
    page = response.content.decode()
    assert "The control plane is unavailable just now" in page and "cannot reach its database" in page
    # Marked down (the probe, which reaches this test's database, may have lifted it since).
    assert any("the database is unreachable" in r.getMessage() for r in caplog.records)


def test_any_other_error_is_still_a_plain_500(signed_in: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(_request: object) -> object:
        raise RuntimeError("a bug")

    monkeypatch.setattr(views, "_membership_or_404", broken)
    response = signed_in.get("/recovery/")
    assert response.status_code == 500
    assert "unavailable" not in response.content.decode()
    assert not availability.is_down(availability.DATABASE)  # nothing marked, no probe started
