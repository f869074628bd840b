"""Approval history is paged like every console list (frontend.paging): 50 decisions a page, the
latest first, Next and Previous walking the same rows both ways (ties in the decision time broken
by the request id, a text key), mangled links landing on the first page, amounts formatted, and
another tenant's decisions never listed."""

from __future__ import annotations

import re
from datetime import timedelta
from html import unescape

import pytest
from django.test import Client
from django.utils import timezone

from approvals.models import ApprovalRequest, Status
from core.scoping import tenant_context
from tenants.models import Tenant
from tests.support.factories import Person

DECIDED = 120


def _browser(person: Person) -> Client:
    client = Client()
    client.force_login(person.user)
    return client


def _decide(tenant: Tenant, prefix: str, count: int) -> list[str]:
    """`count` decided requests, the newest decision first; every third pair shares its moment."""
    now = timezone.now()
    made = []
    with tenant_context(tenant):
        for n in range(count):
            at = now - timedelta(seconds=(n // 2) * 7)
            made.append(
                ApprovalRequest.objects.create(
                    id=f"{prefix}{n:04d}",
                    saga_id=f"{prefix}-saga-{n}",
                    step_id="1",
                    tool="bank.wire",
                    args={"amount": 25000 + n, "currency": "EUR"},
                    args_digest="0" * 64,
                    action={"tool": "bank.wire", "amount": 25000 + n},
                    action_digest="0" * 64,
                    status=Status.APPROVED if n % 3 else Status.DENIED,
                    expires_at=at + timedelta(hours=1),
                    decided_at=at,
                    decided_by="user:ann",
                )
            )
    ordered = sorted(made, key=lambda r: (r.decided_at, r.pk), reverse=True)
    return [r.pk for r in ordered]


def _rows(html: str) -> list[str]:
    return re.findall(r'<tr data-approval="([^"]+)"', html)


def _link(html: str, rel: str) -> str:
    found = re.search(rf'<a href="([^"]+)" rel="{rel}">', html)
    return unescape(found.group(1)) if found else ""


@pytest.fixture
def history(alice: Person, carol: Person) -> list[str]:
    _decide(carol.tenant, "other", 3)
    return _decide(alice.tenant, "req", DECIDED)


def test_history_pages_walk_the_same_rows_both_ways(alice: Person, history: list[str]) -> None:
    client = _browser(alice)
    pages, html, url = [], client.get("/approvals/history/").content.decode(), "/approvals/history/"
    while True:
        pages.append(_rows(html))
        following = _link(html, "next")
        if not following:
            break
        url = "/approvals/history/" + following
        html = client.get(url).content.decode()
    assert [len(p) for p in pages] == [50, 50, 20]
    assert [r for p in pages for r in p] == history  # latest first, each decision once
    back = []
    while (previous := _link(html, "prev")) != "":
        html = client.get("/approvals/history/" + previous).content.decode()
        back.append(_rows(html))
    assert back == [pages[1], pages[0]]


def test_history_shows_amounts_with_their_currency(alice: Person, history: list[str]) -> None:
    html = _browser(alice).get("/approvals/history/").content.decode()
    row = html.split('<tr data-approval="req0000"')[1].split("</tr>")[0]
    assert '<td class="num">25,000 EUR</td>' in row


@pytest.mark.parametrize(
    "query",
    [
        "?before=-1",
        "?before=abc",
        "?before=2026-01-01T00:00:00~",
        "?after=" + "9" * 500,
        "?before=2026-01-01~x",
    ],
)
def test_mangled_history_links_land_on_a_page(alice: Person, history: list[str], query: str) -> None:
    response = _browser(alice).get("/approvals/history/" + query)
    assert response.status_code == 200
    assert _rows(response.content.decode()) == history[:50]


def test_another_tenant_sees_only_its_own_history(carol: Person, history: list[str]) -> None:
    rows = _rows(_browser(carol).get("/approvals/history/").content.decode())
    assert sorted(rows) == ["other0000", "other0001", "other0002"]
