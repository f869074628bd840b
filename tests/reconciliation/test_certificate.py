"""What the certificate counts: each committed effect accounted for (completed, compensated and
confirmed, or explicitly made terminal by a person in recovery's human queue) or named as an
exception with its reason."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from sagaplane.certificate import verify_certificate

from audit.services import chain_pending_server_records
from core.scoping import tenant_context
from reconciliation import services
from recovery import selectors as recovery_selectors
from recovery import services as recovery
from recovery.models import JobState
from recovery.tasks import sweep_tenant
from tenants.actors import api_key_actor, named_actor, user_actor
from tenants.models import Tenant
from tests.support.chains import Writer, compensated_saga
from tests.support.scoping import in_tenant
from tests.support.transparency import settle
from transparency import services as transparency

pytestmark = pytest.mark.usefixtures("no_delay")


def _certificate(tenant: Tenant) -> dict:
    settle(tenant)
    note = in_tenant(
        services.issue_certificate, tenant, timezone.now() - timedelta(hours=1), actor=named_actor("test")
    )
    with tenant_context(tenant):
        keys = transparency.current_verifier_keys()
    return verify_certificate(note, keys).statement


def _abandoned(writer: Writer, saga_id: str, semantics: str) -> None:
    """An agent that died after an effect: no terminal record, a lease of one second."""
    step = {"saga_id": saga_id, "step_id": f"{saga_id}-s0", "tool": "wire.send", "semantics": semantics}
    writer.ship(
        ("SAGA_START", {"saga_id": saga_id, "name": "payout", "lease_ttl": 1}),
        ("STEP_INTENT", {**step, "kwargs": {"amount": 500}}),
        ("STEP_COMMITTED", {**step, "compensation": None}),
    )


def test_an_open_saga_is_an_exception_until_a_person_resolves_it(tenant_a: Tenant, agent_a: Writer) -> None:
    agent_a.saga("paid-1")
    _abandoned(agent_a, "payout-1", "IRREVERSIBLE")
    statement = _certificate(tenant_a)
    assert [(e["saga_id"], e["reason"]) for e in statement["exceptions"]] == [("payout-1", "in_flight")]
    assert statement["accounted"]["completed"] == 2

    sweep_tenant(tenant_a, now=timezone.now() + timedelta(minutes=5))  # the lease lapsed: taken over
    with tenant_context(tenant_a):
        (job,) = recovery_selectors.human_queue()  # irreversible, no inverse: for a person
    in_tenant(
        recovery.resolve,
        tenant_a,
        job.pk,
        recovery.Resolution("wire recalled by phone with the bank"),
        actor=user_actor("risk"),
    )
    with tenant_context(tenant_a):
        resolved = recovery_selectors.job(job.pk)
        assert resolved is not None and resolved.state == JobState.RESOLVED
    statement = _certificate(tenant_a)
    assert statement["exceptions"] == [] and statement["clean"] is True
    assert statement["accounted"] == {"completed": 2, "compensated_confirmed": 0, "resolved": 1}


def test_an_unreconciled_compensation_is_an_exception(tenant_a: Tenant, agent_a: Writer) -> None:
    compensated_saga(agent_a, "refund-1")
    statement = _certificate(tenant_a)  # no check yet, or no verdict: never counted as fine
    assert [(e["saga_id"], e["reason"]) for e in statement["exceptions"]] == [("refund-1", "unreconciled")]


def test_a_log_without_a_checkpoint_has_no_certificate(tenant_a: Tenant) -> None:
    from core.errors import DomainError

    with pytest.raises(DomainError) as refused:
        in_tenant(
            services.issue_certificate,
            tenant_a,
            timezone.now() - timedelta(hours=1),
            actor=named_actor("test"),
        )
    assert (refused.value.status, refused.value.code) == (404, "no_checkpoint")


def test_a_step_compensated_by_a_recovery_worker_is_checked_too(tenant_a: Tenant, agent_a: Writer) -> None:
    """The agent died after the charge; recovery refunded it (a COMPENSATED record in the server
    stream): reconciliation checks that refund like any other."""
    step = {"saga_id": "died-1", "step_id": "died-1-s0", "tool": "shop.charge", "semantics": "COMPENSABLE"}
    compensation = {
        "fn": "refund",
        "handler": "shop.refund",
        "recoverable": True,
        "description": "",
        "idempotency_key": "idem-died",
        "kwargs": {"charge_id": "ch_died"},
    }
    agent_a.ship(
        ("SAGA_START", {"saga_id": "died-1", "name": "checkout", "lease_ttl": 1}),
        ("STEP_INTENT", {**step, "kwargs": {"amount": 42}}),
        ("STEP_COMMITTED", {**step, "compensation": compensation}),
    )
    sweep_tenant(tenant_a, now=timezone.now() + timedelta(minutes=5))
    job = in_tenant(recovery.claim, tenant_a, worker="recovery-worker", handlers=["shop.refund"])
    assert job is not None
    completion = recovery.Completion(token=job.epoch)
    in_tenant(recovery.complete, tenant_a, job.pk, completion, actor=api_key_actor("recovery"))
    chain_pending_server_records(tenant_a, wait=True)  # the sweep's (results are chained in batches)
    (check,) = in_tenant(services.scan, tenant_a)
    assert (check.saga_id, check.compensated_in, check.handler) == ("died-1", "server", "shop.refund")
    assert check.kwargs == {"charge_id": "ch_died"}
