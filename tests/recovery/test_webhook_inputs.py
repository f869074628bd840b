"""The webhook's PUT as a typed input (recovery/inputs.py): the API refuses what it refused
before, in the one error shape naming the same field, and keeps the same webhook."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import override_settings

from tests.support.factories import Person

pytestmark = pytest.mark.django_db

API = "/api/v1/recovery/webhook"
URL = "url: an http(s) URL of at most 500 characters"
HANDLERS = "handlers: a list of up to 100 handler names"
PUBLIC = "https://93.184.216.34/hook"  # an address literal: nothing to resolve


def _shape(answer: Any) -> tuple[int, str, str, str]:
    body = answer.json()
    return answer.status_code, body["error"], body["detail"], body["field"]


@override_settings(SAGAPLANE_WEBHOOK_ALLOW_PRIVATE=False)
def test_webhook_bodies_are_refused_by_field_in_the_error_shape(alice: Person) -> None:
    session = alice.session_client()
    cases: list[tuple[Any, tuple[int, str, str, str]]] = [
        ([PUBLIC], (400, "invalid", "the body must be a JSON object", "body")),
        ({}, (400, "invalid", URL, "url")),
        ({"url": None}, (400, "invalid", URL, "url")),
        ({"url": 5}, (400, "invalid", URL, "url")),
        ({"url": "https://x.example/" + "a" * 500}, (400, "invalid", URL, "url")),
        ({"url": "ftp://x.example/hook"}, (400, "invalid", URL, "url")),
        ({"url": PUBLIC, "handlers": "shop.refund"}, (400, "invalid", HANDLERS, "handlers")),
        ({"url": PUBLIC, "handlers": [""]}, (400, "invalid", HANDLERS, "handlers")),
        ({"url": PUBLIC, "handlers": ["a\x00"]}, (400, "invalid", HANDLERS, "handlers")),
        ({"url": PUBLIC, "handlers": [5]}, (400, "invalid", HANDLERS, "handlers")),
        ({"url": PUBLIC, "handlers": ["h"] * 101}, (400, "invalid", HANDLERS, "handlers")),
        ({"url": "ftp://x", "handlers": 5}, (400, "invalid", URL, "url")),  # the url first
    ]
    for body, expected in cases:
        assert _shape(session.put(API, body, format="json")) == expected, body
    unsafe = session.put(API, {"url": "http://169.254.169.254/x"}, format="json")
    assert (unsafe.status_code, unsafe.json()["error"], unsafe.json()["field"]) == (400, "unsafe_url", "url")
    assert session.get(API).json() == {"url": None, "handlers": [], "actor": None}


@override_settings(SAGAPLANE_WEBHOOK_ALLOW_PRIVATE=False)
@pytest.mark.parametrize(
    ("handlers", "kept"), [(None, []), ([], []), (["shop.refund", "mail.undo"], ["shop.refund", "mail.undo"])]
)
def test_a_webhook_is_kept_as_before(alice: Person, handlers: Any, kept: list[str]) -> None:
    session = alice.session_client()
    body = {"url": PUBLIC} if handlers is None else {"url": PUBLIC, "handlers": handlers}
    answer = session.put(API, body, format="json")
    assert answer.status_code == 200, answer.content
    assert (answer.json()["url"], answer.json()["handlers"]) == (PUBLIC, kept)
    assert answer.json()["secret"]
    shown = session.get(API).json()
    assert (shown["url"], shown["handlers"]) == (PUBLIC, kept)
