"""Takeover that cannot starve (issue 23), in process: a worker's claim takes over its tenant's
expired leases itself (no sweep needed), once; the sweep records each pass, and its lag is on
/metrics, in /readyz's detail and on the dashboard."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from core.scoping import tenant_context
from recovery import services, sweeper
from recovery.actions import takeover
from recovery.models import Job, Lease, LeaseState, Run, SweepPass
from recovery.tasks import sweep_all
from tenants.models import Tenant
from tests.recovery.sagas import HANDLER, crashed, expire
from tests.support.chains import Writer, server_stream
from tests.support.factories import Person
from tests.support.metrics import scrape, value
from tests.support.scoping import in_tenant

pytestmark = pytest.mark.django_db


def test_a_claim_takes_over_expired_leases_itself_without_a_sweep(tenant_a: Tenant, writer_a: Writer) -> None:
    crashed(writer_a, "no-sweep", steps=2, lease_ttl=600)
    takeover._takeover_looked.clear()
    assert in_tenant(services.claim, tenant_a, worker="w", handlers=[HANDLER]) is None  # the agent holds it
    expire(tenant_a, "no-sweep")
    takeover._takeover_looked.clear()  # the claim looks at most every CLAIM_TAKEOVER_EVERY_S
    job = in_tenant(services.claim, tenant_a, worker="w", handlers=[HANDLER])
    assert job is not None and job.saga_id == "no-sweep" and job.ordinal == 2  # newest first
    with tenant_context(tenant_a):
        lease = Lease.objects.get(saga_id="no-sweep")
        assert lease.state == LeaseState.SWEPT and lease.swept_at is not None
        assert Run.objects.filter(saga_id="no-sweep").count() == 1
        assert Job.objects.filter(saga_id="no-sweep").count() == 2
    started = [r for r in server_stream(tenant_a) if r["event"] == "RECOVERY_STARTED"]
    assert [r["saga_id"] for r in started] == ["no-sweep"]
    # Taken over once: neither a later claim nor the sweep starts a second run.
    takeover._takeover_looked.clear()
    assert in_tenant(services.claim, tenant_a, worker="w2", handlers=[HANDLER]) is None  # step 1 waits for 2
    sweep_all()
    with tenant_context(tenant_a):
        assert Run.objects.filter(saga_id="no-sweep").count() == 1


def test_a_claim_looks_for_expired_leases_at_most_every_half_second(
    tenant_a: Tenant, writer_a: Writer
) -> None:
    takeover._takeover_looked.clear()
    assert in_tenant(services.claim, tenant_a, worker="w", handlers=[HANDLER]) is None  # looked: nothing due
    crashed(writer_a, "later", steps=1, lease_ttl=600)
    expire(tenant_a, "later")
    assert in_tenant(services.take_over_on_claim, tenant_a) == 0  # within the interval: not looked again
    takeover._takeover_looked.clear()
    assert in_tenant(services.take_over_on_claim, tenant_a) == 1


def test_each_sweep_pass_is_recorded_and_its_lag_is_reported(db: None, alice: Person) -> None:
    SweepPass.objects.all().delete()
    assert sweeper.status() == {"status": "never_ran", "lag_s": None}
    assert value(scrape(), "sagaplane_recovery_sweep_lag_seconds") == float("inf")
    sweep_all()
    assert sweeper.status()["status"] == "ok"
    ready = Client().get("/readyz").json()
    assert ready["detail"]["recovery_sweep"]["status"] == "ok"
    assert value(scrape(), "sagaplane_recovery_sweep_lag_seconds") < sweeper.LAG_WARN_S
    page = Client()
    page.force_login(alice.user)
    assert 'id="sweep-lag-banner"' not in page.get("/sagas/").content.decode()
    # No pass for a minute (the beat is down or wedged): every signal says so.
    SweepPass.objects.update(finished_at=timezone.now() - timedelta(seconds=60))
    ready = Client().get("/readyz")
    assert ready.status_code == 200  # detail, not unreadiness: the replica itself serves fine
    assert ready.json()["detail"]["recovery_sweep"]["status"] == "lagging"
    assert ready.json()["detail"]["recovery_sweep"]["lag_s"] >= 60
    assert value(scrape(), "sagaplane_recovery_sweep_lag_seconds") >= 60
    assert 'id="sweep-lag-banner"' in page.get("/sagas/").content.decode()
    assert 'id="sweep-lag-banner"' in page.get("/recovery/").content.decode()
