"""Reconciliation's services against the real ingest and projection: checks from compensations,
claims with fencing tokens, verdicts recorded in the server stream, deadlines, tenancy."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from core.errors import DomainError
from core.scoping import tenant_context
from reconciliation import selectors, services
from reconciliation.inputs import Answer
from reconciliation.models import CheckStatus, Reason
from tenants.actors import api_key_actor, user_actor
from tenants.models import Tenant
from tests.support.chains import Writer, compensated_saga, server_stream
from tests.support.scoping import in_tenant

pytestmark = pytest.mark.usefixtures("no_delay")


def _claim(tenant: Tenant, handlers: list[str] | None = None, worker: str = "w1") -> list:
    terms = services.ReconciliationClaim.parse({"handlers": handlers or ["shop.refund"], "worker": worker})
    return in_tenant(services.claim, tenant, terms, actor=api_key_actor("test"))


def test_each_compensated_step_becomes_one_check_for_its_handler(tenant_a: Tenant, agent_a: Writer) -> None:
    steps = compensated_saga(agent_a, "checkout-1", charges=["ch_1", "ch_2"])
    created = in_tenant(services.scan, tenant_a)
    assert sorted(c.step_id for c in created) == sorted(steps)
    check = next(c for c in created if c.step_id == steps[0])
    assert (check.handler, check.kwargs, check.status) == ("shop.refund", {"charge_id": "ch_1"}, "pending")
    assert check.idempotency_key == f"idem-{steps[0]}"
    assert check.compensated_in == "agent-a-1"
    assert in_tenant(services.scan, tenant_a) == []  # the watermark moved: nothing twice
    # The same step compensated again (say by a recovery worker) is still one check.
    agent_a.ship(("COMPENSATED", {"saga_id": "checkout-1", "step_id": steps[0], "tool": "shop.charge"}))
    assert in_tenant(services.scan, tenant_a) == []
    with tenant_context(tenant_a):
        assert selectors.status_counts()["pending"] == 2


def test_confirmed_drift_and_unknown_are_three_verdicts_each_recorded(
    tenant_a: Tenant, agent_a: Writer
) -> None:
    compensated_saga(agent_a, "checkout-1", charges=["ch_1", "ch_2", "ch_3"])
    in_tenant(services.scan, tenant_a)
    claimed = _claim(tenant_a)
    assert len(claimed) == 3 and all(c.token == 1 and c.status == "claimed" for c in claimed)
    by_charge = {c.kwargs["charge_id"]: c for c in claimed}
    answers = {"ch_1": True, "ch_2": False, "ch_3": None}
    for charge, answer in answers.items():
        check = by_charge[charge]
        in_tenant(
            services.report,
            tenant_a,
            check.pk,
            Answer(check.token, answer, f"ledger {charge}"),
            actor=api_key_actor("w"),
        )
    with tenant_context(tenant_a):
        report = selectors.report(timezone.now() - timedelta(hours=1))
    outcomes = {item.detail: item.outcome for item in report.items}
    assert outcomes == {"ledger ch_1": "confirmed", "ledger ch_2": "drift", "ledger ch_3": "unverifiable"}
    assert report.outcome == "drift"
    verdicts = [r for r in server_stream(tenant_a) if r["event"] == services.VERDICT_EVENT]
    assert sorted(v["verdict"] for v in verdicts) == ["confirmed", "drift", "unverifiable"]
    for v in verdicts:
        assert v["saga_id"] == "checkout-1" and v["actor"] == "api-key:w"
        assert v["old"]["status"] == "claimed" and v["new"]["status"] == v["verdict"]


def test_a_stale_token_cannot_record_a_verdict(tenant_a: Tenant, agent_a: Writer, settings) -> None:
    settings.SAGAPLANE_RECONCILE_LEASE_SECONDS = 0  # a claim's lease has lapsed by the next claim
    compensated_saga(agent_a, "checkout-1")
    in_tenant(services.scan, tenant_a)
    (first,) = _claim(tenant_a, worker="zombie")
    (second,) = _claim(tenant_a, worker="successor")  # the lease lapsed: claimed again
    assert second.pk == first.pk and second.token == first.token + 1
    with pytest.raises(DomainError) as refused:
        in_tenant(
            services.report,
            tenant_a,
            first.pk,
            Answer(first.token, False),
            actor=api_key_actor("zombie"),
        )
    assert (refused.value.status, refused.value.code) == (409, "stale_token")
    in_tenant(
        services.report,
        tenant_a,
        second.pk,
        Answer(second.token, True),
        actor=api_key_actor("successor"),
    )
    with pytest.raises(DomainError) as again:
        in_tenant(
            services.report,
            tenant_a,
            second.pk,
            Answer(second.token, False),
            actor=api_key_actor("successor"),
        )
    assert again.value.code == "already_decided"
    verdicts = [r for r in server_stream(tenant_a) if r["event"] == services.VERDICT_EVENT]
    assert [(v["verdict"], v["observer"]) for v in verdicts] == [("confirmed", "successor")]


def test_nobody_answering_is_unverifiable_never_fine(tenant_a: Tenant, agent_a: Writer) -> None:
    compensated_saga(agent_a, "no-observer")
    compensated_saga(agent_a, "silent", charges=["ch_9"])
    in_tenant(services.scan, tenant_a)
    with tenant_context(tenant_a):
        report = selectors.report(timezone.now() - timedelta(hours=1))
    assert report.outcome == "unverifiable" and report.counts["pending"] == 2  # not yet answered: not fine
    silent = next(c for c in _claim(tenant_a, worker="w-silent") if c.saga_id == "silent")
    # Only the claimed one goes back... both were claimed; report nothing, let the deadline pass.
    assert silent.token == 1
    later = timezone.now() + timedelta(seconds=301)
    assert in_tenant(services.expire_overdue, tenant_a, now=later) == 2
    with tenant_context(tenant_a):
        report = selectors.report(timezone.now() - timedelta(hours=1))
    assert report.outcome == "unverifiable"
    assert {i.reason for i in report.items} == {Reason.OBSERVER_SILENT}


def test_no_claim_before_the_deadline_is_no_observer(tenant_a: Tenant, agent_a: Writer) -> None:
    compensated_saga(agent_a, "orphan-refund")
    in_tenant(services.scan, tenant_a)
    assert _claim(tenant_a, handlers=["shop.other"]) == []  # an observer for something else
    in_tenant(services.expire_overdue, tenant_a, now=timezone.now() + timedelta(seconds=301))
    with tenant_context(tenant_a):
        (item,) = selectors.report(timezone.now() - timedelta(hours=1)).items
    assert (item.outcome, item.reason) == ("unverifiable", Reason.NO_OBSERVER)


def test_a_compensation_without_a_handler_is_unverifiable_at_once(tenant_a: Tenant, agent_a: Writer) -> None:
    compensated_saga(agent_a, "closure-only", handler=None)
    in_tenant(services.scan, tenant_a)
    with tenant_context(tenant_a):
        (item,) = selectors.report(timezone.now() - timedelta(hours=1)).items
    assert (item.outcome, item.reason) == ("unverifiable", Reason.NO_HANDLER)


def test_recheck_reopens_a_verdict_and_records_it(tenant_a: Tenant, agent_a: Writer) -> None:
    compensated_saga(agent_a, "checkout-1")
    in_tenant(services.scan, tenant_a)
    (check,) = _claim(tenant_a)
    in_tenant(services.report, tenant_a, check.pk, Answer(check.token, False), actor=api_key_actor("w"))
    reopened = in_tenant(services.recheck, tenant_a, check.pk, actor=user_actor("alice"))
    assert reopened.status == CheckStatus.PENDING
    (again,) = _claim(tenant_a)
    assert again.token == check.token + 1
    in_tenant(services.report, tenant_a, again.pk, Answer(again.token, True), actor=api_key_actor("w"))
    events = [r["event"] for r in server_stream(tenant_a) if r["event"].startswith("RECONCILIATION_")]
    assert events == ["RECONCILIATION_VERDICT", "RECONCILIATION_RECHECK", "RECONCILIATION_VERDICT"]


def test_a_third_tenant_sees_and_claims_nothing(tenant_a: Tenant, tenant_b: Tenant, agent_a: Writer) -> None:
    compensated_saga(agent_a, "acme-checkout")
    in_tenant(services.scan, tenant_a)
    assert in_tenant(services.scan, tenant_b) == []
    assert _claim(tenant_b) == []
    (check,) = _claim(tenant_a)
    with pytest.raises(DomainError) as refused:
        in_tenant(services.report, tenant_b, check.pk, Answer(check.token, True), actor=api_key_actor("b"))
    assert refused.value.status == 404
    with tenant_context(tenant_b):
        assert selectors.report(timezone.now() - timedelta(hours=1)).items == []
        assert selectors.check(check.pk) is None
    # acme has an open check (due for a webhook, or to expire); bravo nothing at all.
    assert services.tenants_to_reconcile() == [tenant_a.pk]


def test_the_pass_finds_only_tenants_with_work(tenant_a: Tenant, tenant_b: Tenant, agent_a: Writer) -> None:
    from reconciliation.tasks import reconcile

    reconcile()  # both tenants' creation records: nothing compensated
    assert services.tenants_to_reconcile() == []
    compensated_saga(agent_a, "checkout-1")
    assert services.tenants_to_reconcile() == [tenant_a.pk]  # new leaves
    assert reconcile()["created"] == 1
    assert services.tenants_to_reconcile() == [tenant_a.pk]  # an open check, due
    (check,) = _claim(tenant_a)
    in_tenant(services.report, tenant_a, check.pk, Answer(check.token, True), actor=api_key_actor("w"))
    reconcile()  # the verdict's own record is a new leaf: looked at once
    assert services.tenants_to_reconcile() == []  # everything decided, nothing new


def test_hostile_report_values_are_refused(tenant_a: Tenant, agent_a: Writer) -> None:
    compensated_saga(agent_a, "checkout-1")
    in_tenant(services.scan, tenant_a)
    (check,) = _claim(tenant_a)
    for body in (
        {"token": "1", "reversed": True},
        {"token": True, "reversed": True},
        {"token": check.token, "reversed": "yes"},
        {"token": check.token, "reversed": 1},
        {"token": check.token, "reversed": True, "detail": ["x"]},
    ):
        with pytest.raises(DomainError) as refused:
            services.ReportAnswer.parse(body)  # the service takes only what this typed
        assert refused.value.status == 400
    with pytest.raises(DomainError):
        in_tenant(services.report, tenant_a, uuid.uuid4(), Answer(1, True), actor=api_key_actor("w"))
    for handlers in ([], "shop.refund", [1], ["x" * 201], None):
        with pytest.raises(DomainError):
            in_tenant(
                services.claim,
                tenant_a,
                services.ReconciliationClaim.parse({"handlers": handlers, "worker": "w"}),
                actor=api_key_actor("w"),
            )
