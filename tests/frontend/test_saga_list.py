"""The saga list: paged by cursor, Newer and Older (filters kept in every link), its counts
bounded, and agents shown by the name they give themselves beside their stream id, from the SDK
through ingest to the page."""

from __future__ import annotations

import html
import re
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import pytest
import sagaplane as sp
from agent_saga import integrity
from django.db.models import F
from django.test import Client
from django.urls import reverse
from sagaplane.chain import verify_chain
from sagaplane.walfile import read_all

from audit import services as audit_services
from core.scoping import tenant_context
from frontend.saga_views import PAGE_SIZE
from sagas import selectors
from sagas.models import Saga, Step
from sagas.services import agent_label
from tenants import founding
from tenants.actors import named_actor
from tests.support.factories import PASSWORD, Person, make_person
from tests.support.inputs import HOSTILE_CURSORS
from tests.support.sagadata import Writer, saga_forward, saga_rollback
from tests.support.scoping import in_tenant


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
    in_tenant(audit_services.ingest, person.tenant, stream, records, actor=named_actor("test"))
    return ids


@pytest.fixture
def many(alice: Person) -> dict[str, list[str]]:
    return {
        "a": ship_sagas(alice, "stream-a", 70, prefix="a"),
        "b": ship_sagas(alice, "stream-b", 55, prefix="b"),
    }


def newest_first(person: Person, **filters: Any) -> list[str]:
    """The tenant's saga ids in the list's order (most recently active first, then newest id)."""
    with tenant_context(person.tenant):
        sagas = Saga.objects.filter(**filters).order_by(F("last_activity_at").desc(nulls_first=True), "-pk")
        return list(sagas.values_list("saga_id", flat=True))


def walk(client: Client, start: str, rel: str) -> tuple[list[list[str]], str]:
    """Follow `rel` links from `start`: the rows of every page and the last page's URL."""
    pages: list[list[str]] = []
    url = start
    while True:
        body = client.get(url if url.startswith("/") else reverse("sagas") + url).content.decode()
        pages.append(rows(body))
        following = link(body, rel)
        if not following:
            return pages, url
        url = following


def test_older_and_newer_page_through_every_saga_exactly_once_in_order(
    alice: Person, many: dict[str, list[str]]
) -> None:
    client = browser(alice)
    expected = newest_first(alice)
    assert sorted(expected) == sorted(many["a"] + many["b"])
    older, last = walk(client, reverse("sagas"), "next")
    assert [len(p) for p in older] == [PAGE_SIZE, PAGE_SIZE, 125 - 2 * PAGE_SIZE]
    assert [saga_id for page in older for saga_id in page] == expected  # all, once, in order
    assert expected[0] == many["b"][-1]  # most recently active first
    # And back up from the oldest page: the same pages, in reverse.
    newer, _ = walk(client, last, "prev")
    assert newer == older[::-1]
    first = client.get(reverse("sagas")).content.decode()
    assert link(first, "prev") == "" and link(first, "first") == ""
    assert not re.search(r"Page \d|of 125", first)  # nothing counts the tenant's sagas


def test_newer_from_near_the_top_is_the_first_page(alice: Person, many: dict[str, list[str]]) -> None:
    """A Newer link that reaches the top with less than a page (new sagas or not) shows the first
    page whole, with no Newer link of its own."""
    client = browser(alice)
    expected = newest_first(alice)
    cursor = selectors.cursor_of(Saga(pk=0, last_activity_at=None))  # before every saga: none
    with tenant_context(alice.tenant):
        third = Saga.objects.get(saga_id=expected[2])
    for place in (selectors.cursor_of(third), cursor):
        body = client.get(reverse("sagas"), {"before": place}).content.decode()
        assert rows(body) == expected[:PAGE_SIZE]
        assert link(body, "prev") == "" and link(body, "first") == ""


def test_filters_live_in_the_url_and_in_every_page_link(alice: Person, many: dict[str, list[str]]) -> None:
    client = browser(alice)
    first = client.get(reverse("sagas"), {"stream": "stream-a", "status": "running"}).content.decode()
    assert rows(first) == newest_first(alice, stream_id="stream-a")[:PAGE_SIZE]
    next_link = link(first, "next")
    query = parse_qs(urlsplit(next_link).query)
    assert query.pop("cursor") and query == {"stream": ["stream-a"], "status": ["running"]}
    assert link(first, "prev") == "" and link(first, "first") == ""
    second = client.get(reverse("sagas") + next_link).content.decode()
    assert rows(second) == newest_first(alice, stream_id="stream-a")[PAGE_SIZE:]
    back = parse_qs(urlsplit(link(second, "prev")).query)
    assert back.pop("before") and back == {"stream": ["stream-a"], "status": ["running"]}
    assert rows(client.get(reverse("sagas") + link(second, "prev")).content.decode()) == rows(first)
    # The live fragment refreshes the same filtered page, not the first page of everything.
    # (the navigation's pending-approvals badge has a live URL of its own on every page)
    live_urls = [html.unescape(url) for url in re.findall(r'data-live-url="([^"]+)"', second)]
    (live,) = [url for url in live_urls if urlsplit(url).path == reverse("saga-rows")]
    assert parse_qs(urlsplit(live).query) == parse_qs(urlsplit(next_link).query)
    assert rows(client.get(live).content.decode()) == rows(second)
    # The filter form shows what the URL says.
    assert re.search(r'<option value="stream-a" selected>', second)


def test_the_tool_and_since_filters_page_by_cursor_too(alice: Person) -> None:
    writer = Writer()
    records: list[dict[str, Any]] = []
    for n in range(60):  # every third saga goes on to send an invoice
        saga_id, forward = saga_forward(writer, saga_id=f"t-{n:03d}")
        records += forward
        if n % 3 == 0:
            records.append(
                writer.record("STEP_INTENT", saga_id=saga_id, step_id=f"{saga_id}-s3", tool="send_invoice")
            )
    in_tenant(audit_services.ingest, alice.tenant, "stream-t", records, actor=named_actor("test"))
    with tenant_context(alice.tenant):
        invoicing = set(Step.objects.filter(tool="send_invoice").values_list("saga__saga_id", flat=True))
    expected = [saga_id for saga_id in newest_first(alice) if saga_id in invoicing]
    assert len(expected) == 20
    monkey = pytest.MonkeyPatch()
    monkey.setattr("frontend.saga_views.PAGE_SIZE", 7)
    try:
        start = reverse("sagas") + "?" + urlencode({"tool": "send_invoice", "since": "24h"})
        older, last = walk(browser(alice), start, "next")
        newer, _ = walk(browser(alice), last, "prev")
    finally:
        monkey.undo()
    assert [len(p) for p in older] == [7, 7, 6]
    assert [saga_id for page in older for saga_id in page] == expected
    assert newer == older[::-1]


HOSTILE_PLACES = [*HOSTILE_CURSORS, "0", "-1", "abc", "99999999999999999999", "1e20", "2.5", ""]


@pytest.mark.parametrize("name", ["cursor", "before", "page"])
@pytest.mark.parametrize("value", HOSTILE_PLACES)
def test_a_forged_place_in_the_list_is_the_first_page(
    alice: Person, many: dict[str, list[str]], name: str, value: str
) -> None:
    for url in (reverse("sagas"), reverse("saga-rows")):
        response = browser(alice).get(url, {name: value})
        assert response.status_code == 200
        assert rows(response.content.decode()) == newest_first(alice)[:PAGE_SIZE]


def count_of(body: str, status: str) -> str:
    return re.search(rf'id="count-{status}"[^>]*><span class="n">([^<]*)<', body).group(1)


def test_status_counts_stop_at_their_cap(
    alice: Person, many: dict[str, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    body = browser(alice).get(reverse("sagas")).content.decode()
    assert count_of(body, "running") == "125" and '<span class="n">125</span> all' in body
    monkeypatch.setattr("frontend.saga_views.COUNT_CAP", 100)
    body = browser(alice).get(reverse("sagas")).content.decode()
    assert count_of(body, "running") == "100+" and '<span class="n">100+</span> all' in body
    assert count_of(body, "completed") == "0"
    # By stream, exact below the cap; a walk that stopped before the end is a lower bound.
    by_stream = browser(alice).get(reverse("sagas"), {"stream": "stream-b"}).content.decode()
    assert count_of(by_stream, "running") == "55"
    monkeypatch.setattr("sagas.selectors.COUNT_WALK", 60)
    by_stream = browser(alice).get(reverse("sagas"), {"stream": "stream-b"}).content.decode()
    assert count_of(by_stream, "running") == "55+"  # the newest 60 running sagas held 55 of b
    by_stream = browser(alice).get(reverse("sagas"), {"stream": "stream-a"}).content.decode()
    assert count_of(by_stream, "running") == "5+"


def test_needs_a_human_counts_exactly_up_to_its_own_cap(
    alice: Person, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer = Writer()
    records: list[dict[str, Any]] = []
    for n in range(4):
        saga_id, forward = saga_forward(writer, saga_id=f"p-{n}")
        records += forward + saga_rollback(writer, saga_id, fail_last=True)
    in_tenant(audit_services.ingest, alice.tenant, "stream-p", records, actor=named_actor("test"))
    monkeypatch.setattr("frontend.saga_views.COUNT_CAP", 2)
    body = browser(alice).get(reverse("sagas"), {"stream": "elsewhere"}).content.decode()
    assert "4 sagas need a human" in body  # whatever the filters, past the tabs' cap
    monkeypatch.setattr("frontend.saga_views.NEEDS_HUMAN_CAP", 3)
    body = browser(alice).get(reverse("sagas")).content.decode()
    assert "3+ sagas need a human" in body


def test_a_third_tenant_pages_through_nothing_of_the_other_two(
    carol: Person, alice: Person, many: dict[str, list[str]]
) -> None:
    ship_sagas(carol, "stream-bravo", 60, prefix="bravo")
    third = make_person(
        founding.create_tenant(
            "charlie", "Charlie Co", "founder@charlie.example", PASSWORD, actor=named_actor("test")
        ),
        "dana",
        "owner",
    )
    client = browser(third)
    with tenant_context(alice.tenant):
        cursors = [selectors.cursor_of(saga) for saga in Saga.objects.all()[:5]]
    with tenant_context(carol.tenant):
        cursors += [selectors.cursor_of(saga) for saga in Saga.objects.all()[:5]]
    urls = [reverse("sagas"), reverse("saga-rows")]
    queries = [{}, {"stream": "stream-a"}, {"stream": "stream-bravo"}, {"status": "running"}, {"since": "1h"}]
    queries += [{"tool": "charge_card"}, *({"cursor": c} for c in cursors), *({"before": c} for c in cursors)]
    for url in urls:
        for query in queries:
            body = client.get(url, query).content.decode()
            assert rows(body) == [] and 'id="saga-pages"' not in body, (url, query)
            assert '<span class="n">0</span> all' in body and "need a human" not in body
            # A filter's own value comes back in the page's links; nothing of the others does.
            shown = re.sub(r'(href|data-live-url)="[^"]*"', "", body)
            for fingerprint in (
                "stream-a",
                "stream-b",
                "stream-bravo",
                "a-0",
                "b-0",
                "bravo-0",
                "Acme",
                "Bravo",
            ):
                assert fingerprint not in shown, (url, query, fingerprint)
    # And the two others still see their own, each only its own.
    assert set(newest_first(carol)) == {f"bravo-{n:03d}" for n in range(60)}
    assert rows(browser(carol).get(reverse("sagas")).content.decode())[0].startswith("bravo-")


def test_agent_label_keeps_what_a_page_and_a_text_column_can_hold() -> None:
    assert agent_label("  billing-bot ") == "billing-bot"
    assert agent_label("bad\x00na\u0007me\ud800") == "badname"
    assert agent_label("x" * 500) == "x" * 100


def test_a_non_string_agent_is_ignored(alice: Person) -> None:
    writer = Writer()
    start = writer.record("SAGA_START", saga_id="odd", name="odd", agent={"not": "a name"})
    in_tenant(audit_services.ingest, alice.tenant, "odd-stream", [start], actor=named_actor("test"))
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
