"""The saga list: paginated (filters kept in every link), and agents shown by the name they give
themselves beside their stream id, from the SDK through ingest to the page."""

from __future__ import annotations

import html
import re
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import sagaplane as sp
from agent_saga import integrity
from django.test import Client
from django.urls import reverse
from sagaplane.chain import verify_chain
from sagaplane.walfile import read_all

from audit import services as audit_services
from frontend.saga_views import PAGE_SIZE
from sagas.services import agent_label
from tests.conftest import Person
from tests.frontend.sagadata import Writer, saga_forward


def read_wal(path: Path) -> list[dict[str, Any]]:
    entries, _ = read_all(path)
    return [entry.record for entry in entries if entry.record is not None]


def browser(person: Person) -> Client:
    client = Client()
    client.force_login(person.user)
    return client


def rows(body: str) -> list[str]:
    return re.findall(r'<tr data-saga="([^"]+)"', body)


def link(body: str, rel: str) -> str:
    found = re.search(rf'<a href="([^"]*)" rel="{rel}">', body)
    return html.unescape(found.group(1)) if found else ""


def ship_sagas(person: Person, stream: str, count: int, *, prefix: str) -> list[str]:
    """`count` running sagas on `stream`, shipped through the real ingest; ids oldest first."""
    writer = Writer()
    ids, records = [], []
    for n in range(count):
        saga_id, saga_records = saga_forward(writer, saga_id=f"{prefix}-{n:03d}")
        ids.append(saga_id)
        records += saga_records
    audit_services.ingest(person.tenant, stream, records, actor="test")
    return ids


@pytest.fixture
def many(alice: Person) -> dict[str, list[str]]:
    return {
        "a": ship_sagas(alice, "stream-a", 70, prefix="a"),
        "b": ship_sagas(alice, "stream-b", 55, prefix="b"),
    }


def test_the_list_is_paginated_and_every_saga_is_on_exactly_one_page(
    alice: Person, many: dict[str, list[str]]
) -> None:
    client = browser(alice)
    pages: list[list[str]] = []
    url = reverse("sagas")
    while url:
        body = client.get(url if url.startswith("/") else reverse("sagas") + url).content.decode()
        pages.append(rows(body))
        url = link(body, "next")
    assert [len(p) for p in pages] == [PAGE_SIZE, PAGE_SIZE, 125 - 2 * PAGE_SIZE]
    seen = [saga_id for page in pages for saga_id in page]
    assert sorted(seen) == sorted(many["a"] + many["b"])  # all of them, none twice
    assert pages[0][0] == many["b"][-1]  # most recently active first
    assert "Page 1 of 3" in client.get(reverse("sagas")).content.decode()


def test_filters_live_in_the_url_and_in_every_page_link(alice: Person, many: dict[str, list[str]]) -> None:
    client = browser(alice)
    first = client.get(reverse("sagas"), {"stream": "stream-a", "status": "running"}).content.decode()
    assert len(rows(first)) == PAGE_SIZE and set(rows(first)) <= set(many["a"])
    next_link = link(first, "next")
    assert parse_qs(urlsplit(next_link).query) == {
        "stream": ["stream-a"],
        "status": ["running"],
        "page": ["2"],
    }
    assert link(first, "prev") == "" and link(first, "first") == ""
    second = client.get(reverse("sagas") + next_link).content.decode()
    assert set(rows(second)) == set(many["a"]) - set(rows(first))
    assert parse_qs(urlsplit(link(second, "prev")).query) == {"stream": ["stream-a"], "status": ["running"]}
    # The live fragment refreshes the same filtered page, not page 1 of everything.
    live = html.unescape(re.search(r'data-live-url="([^"]+)"', second).group(1))
    assert urlsplit(live).path == reverse("saga-rows")
    assert parse_qs(urlsplit(live).query) == {"stream": ["stream-a"], "status": ["running"], "page": ["2"]}
    assert rows(client.get(live).content.decode()) == rows(second)
    # The filter form shows what the URL says.
    assert re.search(r'<option value="stream-a" selected>', second)


@pytest.mark.parametrize("page", ["0", "-1", "abc", "99999999999999999999", "1e20", "2.5", ""])
def test_any_page_parameter_is_answered_with_a_real_page(
    alice: Person, many: dict[str, list[str]], page: str
) -> None:
    response = browser(alice).get(reverse("sagas"), {"page": page})
    assert response.status_code == 200
    assert len(rows(response.content.decode())) in (PAGE_SIZE, 125 - 2 * PAGE_SIZE)


def test_another_tenant_pages_through_nothing_of_acme(
    carol: Person, alice: Person, many: dict[str, list[str]]
) -> None:
    body = browser(carol).get(reverse("sagas"), {"page": "2"}).content.decode()
    assert rows(body) == [] and "stream-a" not in body and 'id="saga-pages"' not in body


def test_agent_label_keeps_what_a_page_and_a_text_column_can_hold() -> None:
    assert agent_label("  billing-bot ") == "billing-bot"
    assert agent_label("bad\x00na\u0007me\ud800") == "badname"
    assert agent_label("x" * 500) == "x" * 100


def test_a_non_string_agent_is_ignored(alice: Person) -> None:
    writer = Writer()
    start = writer.record("SAGA_START", saga_id="odd", name="odd", agent={"not": "a name"})
    audit_services.ingest(alice.tenant, "odd-stream", [start], actor="test")
    body = browser(alice).get(reverse("sagas")).content.decode()
    assert 'data-saga="odd"' in body and "agent-name" not in body


# -- end to end: the SDK names its agent -----------------------------------------------------------


@sp.tool(semantics=sp.REVERSIBLE, compensate=lambda r: None)
def look_up_invoice(number: str) -> str:
    return f"invoice {number}"


def test_the_agent_name_goes_from_the_sdk_through_ingest_to_the_page(
    transactional_db: None, live_server: Any, alice: Person, tmp_path: Path
) -> None:
    named = sp.WAL(tmp_path / "billing.wal", agent="billing-bot")
    unnamed = sp.WAL(tmp_path / "plain.wal")
    try:
        with sp.saga(name="monthly-invoices", wal=named) as billing:
            look_up_invoice("2024-001")
        with sp.saga(name="anonymous", wal=unnamed) as anonymous:
            look_up_invoice("2024-002")
        for wal in (named, unnamed):
            wal.sync()
            shipper = sp.Shipper(
                wal.path, stream_id=wal.stream_id, url=live_server.url, api_key=alice.api_key
            )
            assert shipper.run_until_caught_up() > 0, shipper.failure
    finally:
        named.close()
        unnamed.close()

    records = read_wal(named.path)
    assert records[0]["event"] == "SAGA_START" and records[0]["agent"] == "billing-bot"
    # Still agent-saga's format: its own verifier accepts the extra field.
    assert verify_chain(records).intact and integrity.verify(records).intact
    assert "agent" not in read_wal(unnamed.path)[0]

    api = sp.Client(live_server.url, alice.api_key)
    assert api.get(f"/api/v1/sagas/{billing.saga_id}").body["saga"]["agent"] == "billing-bot"
    assert api.get(f"/api/v1/sagas/{anonymous.saga_id}").body["saga"]["agent"] == ""

    body = browser(alice).get(reverse("sagas")).content.decode()
    row = re.search(rf'<tr data-saga="{billing.saga_id}".*?</tr>', body, re.S).group(0)
    assert (
        f'<strong class="agent-name">billing-bot</strong> <code class="stream-id">{named.stream_id}</code>'
        in row
    )
    plain = re.search(rf'<tr data-saga="{anonymous.saga_id}".*?</tr>', body, re.S).group(0)
    assert "agent-name" not in plain and unnamed.stream_id in plain
    # The stream filter and the fleet's lanes name the agent too.
    assert f'<option value="{named.stream_id}">billing-bot · {named.stream_id}</option>' in body
    fleet = browser(alice).get(reverse("fleet")).content.decode()
    lane = re.search(rf'<g class="lane-row" data-stream="{named.stream_id}">.*?</text>', fleet, re.S).group(0)
    assert lane.endswith(f"<title>billing-bot · {named.stream_id}</title>billing-bot</text>")


def test_the_sdk_refuses_an_agent_name_the_dashboard_could_not_show(tmp_path: Path) -> None:
    for bad in ["", "   ", "x" * 101, "tab\there", "nul\x00"]:
        with pytest.raises(ValueError, match="agent"):
            sp.WAL(tmp_path / "bad.wal", agent=bad)
    assert not (tmp_path / "bad.wal").exists()
    wal = sp.WAL(tmp_path / "ok.wal", agent=" trimmed ")
    try:
        assert wal.agent == "trimmed"
    finally:
        wal.close()
