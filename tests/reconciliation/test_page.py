"""The drift report page: drift first, unverifiable beside it, never folded into "fine"; risk staff
re-open a verdict (recorded), viewers only read, another tenant sees none of it."""

from __future__ import annotations

import pytest
from django.test import Client

from reconciliation import services
from reconciliation.models import CheckStatus
from tenants.models import Tenant
from tests.reconciliation.conftest import compensated_saga
from tests.support.chains import Writer, server_stream
from tests.support.factories import Person

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
    services.scan(tenant_a)
    checks = services.claim(tenant_a, handlers=["shop.refund"], worker="observer-1", actor="api-key:w")
    answers = {"ch_d": False, "ch_ok": True, "ch_u": None}
    ids = {}
    for check in checks:
        charge = check.kwargs["charge_id"]
        services.report(tenant_a, check.pk, token=check.token, reversed_=answers[charge], actor="api-key:w")
        ids[charge] = str(check.pk)
    return ids


def test_the_page_shows_drift_and_unverifiable_apart(alice: Person, verdicts: dict[str, str]) -> None:
    response = _browser(alice).get("/reconciliation/")
    assert response.status_code == 200
    html = response.content.decode()
    drift = html[html.index('id="drift-table"') : html.index('id="unverifiable-heading"')]
    unverifiable = html[html.index('id="unverifiable-table"') : html.index('id="open-heading"')]
    assert "refund-drifted" in drift and "refund-landed" not in drift
    assert "refund-unknown" in unverifiable and "closure-only" in unverifiable
    assert "refund-landed" not in unverifiable
    assert 'id="count-confirmed">1<' in html
    assert "Check again" in html  # owners are risk staff
    assert 'href="/reconciliation/"' in html  # in the navigation


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
    assert "refund-drifted" not in html and 'id="no-drift"' in html
    assert browser.post(f"/reconciliation/checks/{verdicts['ch_d']}/recheck").status_code == 404
    assert browser.post("/reconciliation/checks/not-a-uuid/recheck").status_code == 404
