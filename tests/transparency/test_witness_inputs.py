"""A witness's add and the quorum as typed inputs (transparency/inputs.py): the API and the
Evidence page refuse what they refused before, in the one error shape, naming the same field, and
keep the values as before (the URL without its trailing slash, the key stripped)."""

from __future__ import annotations

from typing import Any

import pytest
from django.utils.html import escape
from sagaplane import cosignature

from core.scoping import tenant_context
from tenants.models import Tenant
from tests.support.factories import Person
from transparency.models import Witness

pytestmark = pytest.mark.django_db

API = "/api/v1/audit"
NAME = "name: 1-64 letters, digits, '.', '_' or '-' (not 'none' or 'witnesses')"
URL = "url: the witness's submission prefix, an http(s) URL"
VKEY = "vkey: a C2SP cosigner verifier key (name+keyid+base64)"
QUORUM = "quorum: a whole number from 0 to the number of witnesses"


def _shape(answer: Any) -> tuple[int, str, str, str]:
    body = answer.json()
    return answer.status_code, body["error"], body["detail"], body["field"]


def test_witness_bodies_are_refused_by_field_in_the_error_shape(alice: Person) -> None:
    session = alice.session_client()
    vkey = cosignature.generate_cosigner("witness.test/inputs").verifier.encode()
    good = {"name": "w1", "url": "http://127.0.0.1:1", "vkey": vkey}
    cases: list[tuple[Any, tuple[int, str, str, str]]] = [
        ([good], (400, "invalid", NAME, "name")),  # not an object: every field missing
        ({"url": good["url"], "vkey": vkey}, (400, "invalid", NAME, "name")),
        ({**good, "name": "none"}, (400, "invalid", NAME, "name")),
        ({**good, "name": "a\x00b"}, (400, "invalid", NAME, "name")),
        ({**good, "name": 7}, (400, "invalid", NAME, "name")),
        ({**good, "url": None}, (400, "invalid", URL + " of at most 500 characters", "url")),
        (
            {**good, "url": "http://x.example/" + "a" * 500},
            (400, "invalid", URL + " of at most 500 characters", "url"),
        ),
        ({**good, "url": "ftp://example.com"}, (400, "invalid", URL, "url")),
        ({"name": "w1", "url": good["url"]}, (400, "invalid", VKEY, "vkey")),
        ({**good, "vkey": ["k"]}, (400, "invalid", VKEY, "vkey")),
    ]
    for body, expected in cases:
        assert _shape(session.post(f"{API}/witnesses", body, format="json")) == expected, body
    refused = session.post(f"{API}/witnesses", {**good, "vkey": "nope"}, format="json")
    assert refused.status_code == 400 and refused.json()["field"] == "vkey"
    assert refused.json()["detail"].startswith("vkey: not a cosigner vkey")


def test_the_quorum_is_refused_by_field_in_the_error_shape(alice: Person) -> None:
    session = alice.session_client()
    cases: list[tuple[Any, tuple[int, str, str, str]]] = [
        ({}, (400, "invalid", "quorum: required", "quorum")),
        ([1], (400, "invalid", "quorum: required", "quorum")),
        ({"quorum": True}, (400, "invalid", QUORUM, "quorum")),
        ({"quorum": "1"}, (400, "invalid", QUORUM, "quorum")),
        ({"quorum": -1}, (400, "invalid", QUORUM, "quorum")),
        ({"quorum": 1.0}, (400, "invalid", QUORUM, "quorum")),
        ({"quorum": 1}, (400, "invalid", "quorum: at most the number of witnesses (0)", "quorum")),
    ]
    for body, expected in cases:
        assert _shape(session.put(f"{API}/witnesses/quorum", body, format="json")) == expected, body
    assert session.put(f"{API}/witnesses/quorum", {"quorum": 0}, format="json").json() == {"quorum": 0}


def test_a_witness_is_kept_as_before(tenant_a: Tenant, alice: Person) -> None:
    vkey = cosignature.generate_cosigner("witness.test/kept").verifier.encode()
    body = {"name": "w1", "url": "http://127.0.0.1:1/prefix//", "vkey": f"  {vkey}\n"}
    created = alice.session_client().post(f"{API}/witnesses", body, format="json")
    assert created.status_code == 201
    assert (created.json()["url"], created.json()["vkey"]) == ("http://127.0.0.1:1/prefix", vkey)
    with tenant_context(tenant_a):
        assert list(Witness.objects.values_list("name", "url", "vkey")) == [
            ("w1", "http://127.0.0.1:1/prefix", vkey)
        ]


def test_the_evidence_pages_forms_are_refused_with_the_same_sentences(
    alice: Person, tenant_a: Tenant
) -> None:
    page = alice.session_client()
    answer = page.post("/evidence/witnesses", {"name": "none", "url": "x", "vkey": "y"}, follow=True)
    assert escape(f"Witness not added: {NAME}") in answer.content.decode()
    answer = page.post("/evidence/witnesses/quorum", {"quorum": "two"}, follow=True)
    assert escape(f"Quorum not set: {QUORUM}") in answer.content.decode()
    with tenant_context(tenant_a):
        assert not Witness.objects.exists()
