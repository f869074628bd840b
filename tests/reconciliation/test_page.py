"""The drift report page: drift first, unverifiable beside it, never folded into "fine"; risk staff
re-open a verdict (recorded), viewers only read, another tenant sees none of it."""

from __future__ import annotations

import re
from html import unescape

import pytest
from django.test import Client
from django.utils import timezone

from reconciliation import services
from reconciliation.inputs import Answer
from reconciliation.models import CheckStatus
from tenants.actors import api_key_actor
from tenants.models import Tenant
from tests.support.chains import Writer, compensated_saga, server_stream
from tests.support.factories import Person
from tests.support.scoping import in_tenant

pytestmark = pytest.mark.usefixtures("no_delay")


def _browser(person: Person) -> Client:
    client = Client()
    client.force_login(person.user)
    return client


@pytest.fixture
def verdicts(tenant_a: Tenant, agent_a: Writer) -> dict[str, str]:
    compensated_saga(agent_a, "refund-drifted", charges=["ch_d"])
    compensated_saga(agent_a, "refund-landed", charges=["ch_ok"])
    compensated_saga(agent_a, "refund-unknown", charges=["ch_u"])
    compensated_saga(agent_a, "closure-only", handler=None)
    in_tenant(services.scan, tenant_a)
    checks = in_tenant(
        services.claim,
        tenant_a,
        services.ReconciliationClaim.parse({"handlers": ["shop.refund"], "worker": "observer-1"}),
        actor=api_key_actor("w"),
    )
    answers = {"ch_d": False, "ch_ok": True, "ch_u": None}
    ids = {}
    for check in checks:
        charge = check.kwargs["charge_id"]
        in_tenant(
            services.report,
            tenant_a,
            check.pk,
            Answer(check.token, answers[charge]),
            actor=api_key_actor("w"),
        )
        ids[charge] = str(check.pk)
    return ids


def _table(html: str, table_id: str) -> str:
    start = html.index(f'id="{table_id}"')
    return html[start : html.index("</table>", start)]


def test_the_page_shows_drift_and_unverifiable_apart(alice: Person, verdicts: dict[str, str]) -> None:
    browser = _browser(alice)
    response = browser.get("/reconciliation/")  # the worst news first: drift
    assert response.status_code == 200
    html = response.content.decode()
    drift = _table(html, "drift-table")
    assert "refund-drifted" in drift and "refund-landed" not in drift and "refund-unknown" not in drift
    assert 'id="unverifiable-table"' not in html
    unverifiable = _table(
        browser.get("/reconciliation/?show=unverifiable").content.decode(), "unverifiable-table"
    )
    assert "refund-unknown" in unverifiable and "closure-only" in unverifiable
    assert "refund-landed" not in unverifiable
    confirmed = _table(browser.get("/reconciliation/?show=confirmed").content.decode(), "confirmed-table")
    assert "refund-landed" in confirmed and "refund-drifted" not in confirmed
    assert 'id="count-confirmed">Confirmed <strong>1</strong>' in html
    assert "Check again" in html  # owners are risk staff
    assert 'href="/reconciliation/"' in html  # in the navigation
    # The observer's arguments read as values, not Python reprs.
    assert "<dt>charge_id</dt><dd><code>ch_d</code></dd>" in drift


def test_the_lists_are_paged_in_a_stable_order_both_ways(
    alice: Person, tenant_a: Tenant, agent_a: Writer
) -> None:
    compensated_saga(agent_a, "many-refunds", charges=[f"ch_{n}" for n in range(120)])
    in_tenant(services.scan, tenant_a)
    browser = _browser(alice)
    pages: list[list[str]] = []
    html = ""
    url = "/reconciliation/?show=open"
    while url:
        html = browser.get(url).content.decode()
        pages.append(re.findall(r'data-check="([0-9a-f-]+)"', html))
        url = _link(html, "next")
    assert [len(p) for p in pages] == [50, 50, 20]
    assert len({c for p in pages for c in p}) == 120  # no row twice, none skipped
    # Previous from the last page is the middle page again, in the same order; then the first.
    middle = browser.get(_link(html, "prev")).content.decode()
    assert re.findall(r'data-check="([0-9a-f-]+)"', middle) == pages[1]
    top = browser.get(_link(middle, "prev")).content.decode()
    assert re.findall(r'data-check="([0-9a-f-]+)"', top) == pages[0]
    assert _link(top, "prev") == ""


def _link(html: str, rel: str) -> str:
    found = re.search(rf'<a href="(\?[^"]+)" rel="{rel}">', html)
    return "/reconciliation/" + unescape(found.group(1)) if found else ""


@pytest.mark.parametrize(
    "query",
    [
        "?page=-1",
        "?page=abc",
        "?show=nonsense",
        "?before=-1",
        "?before=abc~def",
        "?after=2026-01-01T00:00:00~1",
        "?before=" + "9" * 5000,
        "?after=2026-01-01T00:00:00%2B00:00~00000000-0000-0000-0000-000000000000&before=x",
        "?show=open&after=9999-12-31T23:59:59%2B00:00~ffffffff-ffff-ffff-ffff-ffffffffffff",
    ],
)
def test_hostile_page_links_land_on_a_page(alice: Person, verdicts: dict[str, str], query: str) -> None:
    response = _browser(alice).get("/reconciliation/" + query)
    assert response.status_code == 200


def test_a_new_tenant_is_told_what_to_run(alice: Person, tenant_a: Tenant, agent_a: Writer) -> None:
    from core.scoping import tenant_context
    from reconciliation.models import Reason, ReconciliationCheck

    compensated_saga(agent_a, "nobody-looks", charges=["ch_a", "ch_b"])
    in_tenant(services.scan, tenant_a)
    with tenant_context(tenant_a):  # their deadline passed with no observer
        ReconciliationCheck.objects.update(
            status=CheckStatus.UNVERIFIABLE, reason=Reason.NO_OBSERVER, decided_at=timezone.now()
        )
    html = _browser(alice).get("/reconciliation/").content.decode()
    assert 'id="observer-guidance"' in html
    assert "<code>shop.refund</code>: 2 checks" in html
    assert '@sp.reconciler("shop.refund")' in html
    assert "sagaplane reconcile-worker" in html


def test_an_empty_tenant_says_what_opens_a_check(carol: Person) -> None:
    html = _browser(carol).get("/reconciliation/").content.decode()
    assert 'id="no-open"' in html and "compensated" in html
    assert 'id="observer-guidance"' not in html


def test_a_viewer_reads_but_cannot_reopen(bob: Person, verdicts: dict[str, str]) -> None:
    browser = _browser(bob)
    html = browser.get("/reconciliation/").content.decode()
    assert "refund-drifted" in html and "Check again" not in html
    assert browser.post(f"/reconciliation/checks/{verdicts['ch_d']}/recheck").status_code == 403


def test_risk_staff_reopen_a_verdict_and_it_is_recorded(
    alice: Person, tenant_a: Tenant, verdicts: dict[str, str]
) -> None:
    response = _browser(alice).post(f"/reconciliation/checks/{verdicts['ch_d']}/recheck")
    assert response.status_code == 302
    from core.scoping import tenant_context
    from reconciliation.models import ReconciliationCheck

    with tenant_context(tenant_a):
        assert ReconciliationCheck.objects.get(pk=verdicts["ch_d"]).status == CheckStatus.PENDING
    (record,) = [r for r in server_stream(tenant_a) if r["event"] == services.RECHECK_EVENT]
    assert record["saga_id"] == "refund-drifted" and record["actor"] == "user:alice@acme.example"
    assert record["old"]["status"] == "drift"


def test_another_tenant_sees_nothing(carol: Person, verdicts: dict[str, str]) -> None:
    browser = _browser(carol)
    html = browser.get("/reconciliation/").content.decode()
    assert "refund-drifted" not in html and 'id="no-open"' in html
    assert 'id="no-drift"' in browser.get("/reconciliation/?show=drift").content.decode()
    assert browser.post(f"/reconciliation/checks/{verdicts['ch_d']}/recheck").status_code == 404
    assert browser.post("/reconciliation/checks/not-a-uuid/recheck").status_code == 404
