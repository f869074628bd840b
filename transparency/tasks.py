"""The integrator and the export builder, as Celery tasks (embedded mode too:
`celery -A controlplane worker -B` on the filesystem broker runs both and the 1 s beat)."""

from __future__ import annotations

import logging
import uuid

from celery import shared_task
from django.core.cache import cache

from controlplane import timing
from controlplane.celery import keep_going
from tenants.models import Tenant
from tenants.scoping import tenant_context
from transparency import hooks, services
from transparency.models import TreeState

log = logging.getLogger(__name__)

# How long a queued integration request blocks the next one. The key goes when its task starts,
# so this matters only when the message is lost (a broker restart): new requests wait at most
# this long, and the 1 s beat integrates meanwhile.
INTEGRATION_REQUEST_TTL = 30


def _request_key(tenant_id: int) -> str:
    return f"transparency:integration-requested:{tenant_id}"


def request_integration(tenant_id: int) -> bool:
    """Queue an integration of the tenant's log unless one is already waiting: however many
    batches arrive, at most one integration task per tenant sits in the broker (they used to
    be one per batch). Returns whether this call queued it.

    No batch is missed: a task takes the request off (`_take_request`) before it reads the log,
    so a batch committed before that point is integrated by it, and one committed after finds no
    request and queues the next task."""
    key = _request_key(tenant_id)
    if not cache.add(key, "1", timeout=INTEGRATION_REQUEST_TTL):
        return False
    try:
        integrate_tenant.delay(tenant_id)
    except Exception:
        cache.delete(key)  # so the next batch asks again
        raise
    return True


def _take_request(tenant_id: int) -> None:
    try:
        cache.delete(_request_key(tenant_id))
    except Exception:  # the cache is down: the request expires by itself, and this run goes on
        log.warning("integration of tenant %s: could not clear its request", tenant_id, exc_info=True)


# How long an integrator's claim on a tenant stands without being renewed (it is renewed every
# pass). A worker killed mid-run leaves its claim behind for at most this long, during which other
# calls (the beat's too) find it and return: the checkpoint waits that long after such a crash.
# A claim that lapses under a slow pass costs nothing but coalescing (the row lock serialises).
INTEGRATOR_CLAIM_TTL = 30


def _claim_key(tenant: Tenant) -> str:
    # Tagged with the tenant's creation time: a database re-created beside a Redis that outlived
    # it (each test run) never finds a previous tenant's claim under a reused id.
    return f"transparency:integrating:{tenant.pk}:{tenant.created_at.timestamp():.6f}"


def _claim(tenant: Tenant, token: str) -> bool:
    """Become the tenant's one running integrator, unless another is. Without the cache, every
    caller proceeds: the TreeState row lock still serialises them, only the coalescing is lost."""
    try:
        return bool(cache.add(_claim_key(tenant), token, timeout=INTEGRATOR_CLAIM_TTL))
    except Exception:
        log.warning("integration of tenant %s: could not claim it", tenant.pk, exc_info=True)
        return True


def _renew(tenant: Tenant, token: str) -> None:
    try:
        cache.set(_claim_key(tenant), token, timeout=INTEGRATOR_CLAIM_TTL)
    except Exception:
        log.warning("integration of tenant %s: could not renew its claim", tenant.pk, exc_info=True)


def _release(tenant: Tenant, token: str) -> None:
    try:
        if cache.get(_claim_key(tenant)) == token:  # not a claim that lapsed and was taken over
            cache.delete(_claim_key(tenant))
    except Exception:  # it lapses by itself
        log.warning("integration of tenant %s: could not release its claim", tenant.pk, exc_info=True)


def _requested(tenant_id: int) -> bool:
    try:
        return bool(cache.get(_request_key(tenant_id)))
    except Exception:
        return False  # the beat finds the grown log


def _integrated_size(tenant: Tenant) -> int:
    with tenant_context(tenant):
        return TreeState.objects.values_list("size", flat=True).first() or 0


@shared_task(name="transparency.integrate_tenant", ignore_result=True)
def integrate_tenant(tenant_id: int) -> int:
    """Seal the sagas the tenant's new leaves finished, then integrate the leaves and the seals
    and sign one checkpoint over both. Sealing runs off the tenant's seal watermark, not this
    call's growth: a crash between sealing and signing is healed by the next call, which the beat
    makes (`integrate_grown_tenants`). Returns the signed size.

    A worker shutting down stops this between chunks (each committed and signed) and the rest is
    requested again, for the next worker.

    Coalesced: one integrator per tenant runs at a time (a claim in the cache). A call that finds
    another running returns at once and leaves its request standing; the running one checks for a
    request after each pass and before it lets go, and runs again if it finds one, so whatever
    committed meanwhile is integrated by it: under sustained ingest one integrator loops, each pass
    taking every leaf committed so far (one checkpoint per pass), instead of tasks queueing on the
    tree lock."""
    tenant = Tenant.objects.get(pk=tenant_id)
    token = uuid.uuid4().hex
    while keep_going():
        if not _claim(tenant, token):
            return _integrated_size(tenant)  # the running integrator sees the request
        try:
            while True:
                _take_request(tenant_id)
                backlog = _integrate_and_seal(tenant)
                # A pass that left work (a backlog past one seal pass) goes again at once, as one
                # asked for by a request would: not at the next beat.
                if not keep_going() or not (backlog or _requested(tenant_id)):
                    break
                _renew(tenant, token)
        finally:
            _release(tenant, token)
        # A request made after the last check, whose task found the claim still held and left.
        if not _requested(tenant_id):
            break
    size = _integrated_size(tenant)
    if not keep_going():
        log.warning(
            "integration of tenant %s stopped at %s leaves: the worker is shutting down", tenant.slug, size
        )
        try:
            request_integration(tenant_id)
        except Exception:  # the beat finds the grown log anyway
            log.warning("integration of tenant %s: could not request the rest", tenant.slug, exc_info=True)
    return size


def _integrate_and_seal(tenant: Tenant) -> bool:
    """One pass: seal what was accepted past the seal watermark (one bounded seal pass), then
    integrate everything accepted so far, the seals included, under one checkpoint (a backlog
    larger than an integration chunk signs one per chunk). Returns whether the seal pass left
    accepted leaves it has not looked at (a backlog): the caller runs another pass at once."""
    try:
        with hooks.integrator_appending():
            with timing.phase("seal_pass"):
                _, sealed_up = services.seal_pass(tenant)
            if keep_going():
                with timing.phase("integrate"):
                    services.integrate_fully(tenant, keep_going=keep_going)
            return not sealed_up
    except services.IntegrationRefused:
        # Never sign what cannot be proven; this needs a human, loudly.
        log.critical("transparency log of tenant %s: integration refused", tenant.slug, exc_info=True)
        raise


@shared_task(name="transparency.integrate_grown_tenants", ignore_result=True)
def integrate_grown_tenants() -> list[int]:
    """Beat, every second: each tenant whose log has unintegrated leaves, or integrated leaves the
    seal pass has not covered yet (two indexed queries, no scan of sagas)."""
    tenant_ids = sorted(set(services.tenants_to_integrate()) | set(services.tenants_to_seal()))
    for tenant_id in tenant_ids:
        if not keep_going():
            break  # the next beat, on another worker, picks the rest up
        try:
            integrate_tenant(tenant_id)
        except services.IntegrationRefused:
            continue  # logged; the other tenants still get their checkpoints
    return tenant_ids


@shared_task(name="transparency.sweep_stale_exports", ignore_result=True)
def sweep_stale_exports() -> dict[str, list[str]]:
    """Beat: re-queue exports whose build went quiet (a worker died mid-build), fail them after
    SAGAPLANE_EXPORT_MAX_ATTEMPTS builds."""
    outcome = services.sweep_stale_exports()
    if outcome["requeued"] or outcome["failed"]:
        log.warning("stale exports: re-queued %s, failed %s", outcome["requeued"], outcome["failed"])
    return outcome


@shared_task(name="transparency.build_export", ignore_result=True)
def build_export(export_id: str, tenant_id: int) -> None:
    services.build_export(Tenant.objects.get(pk=tenant_id), export_id)
