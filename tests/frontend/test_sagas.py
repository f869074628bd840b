"""Saga pages without a browser: list, filters, counts, detail timeline order, isolation."""

from __future__ import annotations

import re

import pytest
from django.test import Client
from django.urls import reverse

from tests.support.factories import Person
from tests.support.sagadata import Writer, saga_forward, saga_rollback
from tests.support.transparency import settle


def browser(person: Person) -> Client:
    client = Client()
    client.force_login(person.user)
    return client


def ship(person: Person, stream: str, records: list[dict]) -> None:
    response = person.key_client().post(
        f"/api/v1/streams/{stream}/records", {"records": records}, format="json"
    )
    assert response.status_code == 200, response.content


@pytest.fixture
def acme_sagas(alice: Person) -> dict[str, str]:
    writer = Writer()
    running, records = saga_forward(writer, name="still-running")
    ship(alice, "agent-1", records)
    clean, records = saga_forward(writer, name="clean-rollback")
    ship(alice, "agent-1", records + saga_rollback(writer, clean))
    other = Writer()
    partial, records = saga_forward(other, name="partial-rollback")
    ship(alice, "agent-2", records + saga_rollback(other, partial, fail_last=True))
    return {"running": running, "clean": clean, "partial": partial}


def test_empty_state_explains_the_first_saga(alice: Person) -> None:
    body = browser(alice).get(reverse("sagas")).content.decode()
    assert "No sagas yet — here is how to send the first one" in body
    assert "create_api_key --tenant acme" in body


def test_list_counts_and_needs_a_human(alice: Person, acme_sagas: dict[str, str]) -> None:
    body = browser(alice).get(reverse("sagas")).content.decode()
    for saga_id in acme_sagas.values():
        assert f'data-saga="{saga_id}"' in body
    assert re.search(r'id="count-running"[^>]*><span class="n">1<', body)
    assert re.search(r'id="count-rolled_back"[^>]*><span class="n">1<', body)
    assert re.search(r'id="count-rollback_partial"[^>]*><span class="n">1<', body)
    assert 'id="needs-human"' in body and "1 saga needs a human" in body
    row = re.search(rf'<tr data-saga="{acme_sagas["partial"]}"[^>]*>', body).group(0)
    assert 'class="needs-human"' in row
    assert "sk_live_" not in body


def test_filters(alice: Person, acme_sagas: dict[str, str]) -> None:
    client = browser(alice)
    only_partial = client.get(reverse("sagas"), {"status": "rollback_partial"}).content.decode()
    assert acme_sagas["partial"] in only_partial and acme_sagas["clean"] not in only_partial
    by_stream = client.get(reverse("saga-rows"), {"stream": "agent-2"}).content.decode()
    assert acme_sagas["partial"] in by_stream and acme_sagas["running"] not in by_stream
    by_tool = client.get(reverse("saga-rows"), {"tool": "send_invoice"}).content.decode()
    assert acme_sagas["running"] not in by_tool and acme_sagas["clean"] in by_tool
    recent = client.get(reverse("saga-rows"), {"since": "1h"}).content.decode()
    assert all(s in recent for s in acme_sagas.values())
    none = client.get(reverse("saga-rows"), {"tool": "nope"}).content.decode()
    assert "No saga matches these filters" in none
    # The fragment is just the list: no layout around it.
    assert "<html" not in by_stream


def test_detail_forward_down_compensations_up(alice: Person, acme_sagas: dict[str, str]) -> None:
    saga_id = acme_sagas["partial"]
    body = browser(alice).get(reverse("saga-detail", args=[saga_id])).content.decode()
    forward = body[body.index('id="forward-steps"') : body.index('id="compensations"')]
    backward = body[body.index('id="compensations"') : body.index('id="records-heading"')]
    assert re.findall(r'data-tool="(\w+)"', forward) == ["charge_card", "reserve_stock", "send_invoice"]
    assert re.findall(r'data-tool="(\w+)"', backward) == ["reserve_stock", "charge_card"]
    assert "out-compensation_failed" in backward and "Compensation failed" in backward
    assert "out-compensated" in backward and "Compensated" in backward
    # The inspector: semantics, arguments, compensation descriptor, chain hash, leaf index.
    assert "COMPENSABLE" in body and "undo_charge_card" in body and "leaf-index" in body
    assert re.search(r'class="chain-hash">[0-9a-f]{64}<', body)
    assert "sk_live_abcdefghijklmnop" not in body and "$credential" in body
    fragment = browser(alice).get(reverse("saga-timeline", args=[saga_id])).content.decode()
    assert 'id="forward-steps"' in fragment and "<html" not in fragment


def test_viewer_reads_sagas_but_no_disclosure_link(bob: Person, acme_sagas: dict[str, str]) -> None:
    response = browser(bob).get(reverse("saga-detail", args=[acme_sagas["clean"]]))
    assert response.status_code == 200
    assert "disclosure" not in response.content.decode().lower()


def test_carol_gets_404_for_acme_sagas(carol: Person, acme_sagas: dict[str, str], alice: Person) -> None:
    client = browser(carol)
    for saga_id in acme_sagas.values():
        assert client.get(reverse("saga-detail", args=[saga_id])).status_code == 404
        assert client.get(reverse("saga-timeline", args=[saga_id])).status_code == 404
    guessed = client.get(reverse("saga-rows"), {"stream": "agent-1"}).content.decode()
    assert "data-saga=" not in guessed and '<span class="n">0</span> all' in guessed
    for url in (reverse("sagas"), reverse("saga-rows"), reverse("fleet"), reverse("evidence")):
        body = client.get(url).content.decode()
        for fingerprint in [*acme_sagas.values(), "agent-1", "agent-2", alice.tenant.name, "charge_card"]:
            assert fingerprint not in body, (url, fingerprint)


def test_fleet_chart_and_matrix(alice: Person, acme_sagas: dict[str, str]) -> None:
    body = browser(alice).get(reverse("fleet")).content.decode()
    assert '<svg class="chart" id="fleet-chart"' in body
    assert body.count('class="lane-row"') == 2
    assert body.count('class="rollback-mark"') == 2
    matrix = body[body.index('id="outcome-matrix"') :]
    # Every cell has fewer than five observations: raw counts, greyed.
    assert 'class="sparse"' in matrix and "heat-" not in matrix


def test_fleet_matrix_shows_rates_from_five(alice: Person) -> None:
    writer = Writer()
    records = []
    for _ in range(5):
        records += saga_forward(writer)[1]
    ship(alice, "agent-9", records)
    matrix = browser(alice).get(reverse("fleet")).content.decode().split('id="outcome-matrix"')[1]
    assert re.search(r'class="heat-4" title="5 steps">100%<', matrix)


def test_a_busy_lane_draws_columns_linking_to_its_sagas(alice: Person) -> None:
    """Past BARS_PER_LANE sagas a lane draws one bar per column of start time, at most SLOTS, its
    colour the worst outcome it holds; the bar links to those sagas in the list."""
    from frontend.fleet_chart import BARS_PER_LANE, SLOTS

    writer = Writer()
    records: list[dict] = []
    for n in range(BARS_PER_LANE + 5):
        saga_id, forward = saga_forward(writer, name=f"busy-{n}")
        records += forward + (saga_rollback(writer, saga_id, fail_last=True) if n == 7 else [])
    ship(alice, "agent-busy", records)
    body = browser(alice).get(reverse("fleet")).content.decode()
    lane = body.split('data-stream="agent-busy"')[1].split("</g>")[0]
    bars = re.findall(r'<a href="([^"]+)" class="bar-link">\s*<title>([^<]+)</title>', lane)
    assert 1 <= len(bars) <= SLOTS
    assert sum(int(title.split()[0]) for _, title in bars) == BARS_PER_LANE + 5
    worst = [href for href, _ in bars if "status=rollback_partial" in href]
    assert worst == ["/sagas/?stream=agent-busy&amp;status=rollback_partial"]
    listed = browser(alice).get("/sagas/?stream=agent-busy&status=rollback_partial").content.decode()
    assert re.findall(r'<tr data-saga="([^"]+)"', listed) and "busy-7" in listed


def test_evidence_streams(alice: Person, acme_sagas: dict[str, str]) -> None:
    body = browser(alice).get(reverse("evidence")).content.decode()
    assert 'data-stream="agent-1"' in body and 'data-stream="agent-2"' in body


def test_evidence_names_each_stream_by_its_agent(alice: Person, acme_sagas: dict[str, str]) -> None:
    writer = Writer()
    ship(alice, "agent-7", saga_forward(writer, agent="billing-bot")[1])
    body = browser(alice).get(reverse("evidence")).content.decode()
    row = body.split('data-stream="agent-7"')[1].split("</th>")[0]
    assert '<strong class="stream-agent">billing-bot</strong>' in row and "<code>agent-7</code>" in row
    unnamed = body.split('data-stream="agent-1"')[1].split("</th>")[0]
    assert "stream-agent" not in unnamed


def test_the_disclosure_is_offered_once_the_saga_is_sealed(alice: Person, acme_sagas: dict[str, str]) -> None:
    """Before its seal the API could only answer 409 `not_sealed`: the page says when it comes."""
    page = reverse("saga-detail", args=[acme_sagas["clean"]])
    before = browser(alice).get(page).content.decode()
    assert 'id="disclosure-link"' not in before
    assert "a disclosure can be downloaded once the saga is sealed" in before
    settle(alice.tenant)  # the sealer seals the finished saga
    after = browser(alice).get(page).content.decode()
    assert 'id="disclosure-link"' in after and "once the saga is sealed" not in after
    assert alice.key_client().get(f"/api/v1/audit/sagas/{acme_sagas['clean']}/disclosure").status_code == 200
    running = browser(alice).get(reverse("saga-detail", args=[acme_sagas["running"]])).content.decode()
    assert 'id="disclosure-link"' not in running  # not finished: not sealed
