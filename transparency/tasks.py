"""The integrator, the sealer and the export builder, as Celery tasks (embedded mode too:
`celery -A controlplane worker -B` on the filesystem broker runs them and the 1 s beat).

The integrator (`integrate_tenant`) extends the tenant's tree and signs checkpoints under the
TreeState lock; the sealer (`seal_tenant`) appends SAGA_SEALED records under the SealState lock.
They run beside each other (two workers, or one after the other on one): the sealer's seals are
leaves like any other, which the integrator signs in its next pass."""

from __future__ import annotations

import hashlib
import logging
import tempfile
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any

from celery import shared_task
from django.core.cache import cache

from core import timing
from core.scoping import tenant_context
from core.shutdown import keep_going
from tenants.entry import tenant_by_id, tenant_task
from tenants.models import Tenant
from transparency import bundles, cosigning, hooks, services, sources
from transparency.actions.common import always
from transparency.models import Checkpoint, ExportStatus, TreeState, Witness

log = logging.getLogger(__name__)

# The two per-tenant workers, coalesced the same way (a request key, a claim key) but apart, so
# sealing runs beside integration instead of inside it: each has its own lock in the database
# (SealState's row, TreeState's row) and its own claim here.
INTEGRATE = "integration"
SEAL = "sealing"
COSIGN = "cosigning"
Kind = str  # INTEGRATE, SEAL or COSIGN

# How long a queued request blocks the next one. The key goes when its task starts, so this
# matters only when the message is lost (a broker restart): new requests wait at most this long,
# and the 1 s beat integrates and seals meanwhile.
INTEGRATION_REQUEST_TTL = 30

# How long a worker's claim on a tenant stands without being renewed (it is renewed every pass).
# A worker killed mid-run leaves its claim behind for at most this long, during which other calls
# (the beat's too) find it and return: the checkpoint (or seal) waits that long after such a crash.
# A claim that lapses under a slow pass costs nothing but coalescing (the row locks serialise).
INTEGRATOR_CLAIM_TTL = 30


def _request_key(tenant_id: int, kind: Kind = INTEGRATE) -> str:
    return f"transparency:{kind}-requested:{tenant_id}"


def _request(tenant_id: int, kind: Kind) -> bool:
    """Queue the tenant's `kind` task unless one is already waiting: however many batches arrive,
    at most one such task per tenant sits in the broker. Returns whether this call queued it.

    No batch is missed: a task takes the request off (`_take_request`) before it reads the log,
    so a batch committed before that point is handled by it, and one committed after finds no
    request and queues the next task."""
    key = _request_key(tenant_id, kind)
    if not cache.add(key, "1", timeout=INTEGRATION_REQUEST_TTL):
        return False
    try:
        {INTEGRATE: integrate_tenant, SEAL: seal_tenant, COSIGN: cosign_tenant}[kind].delay(tenant_id)
    except Exception:
        cache.delete(key)  # so the next batch asks again
        raise
    return True


def request_integration(tenant_id: int) -> bool:
    """Queue an integration of the tenant's log (coalesced, see `_request`)."""
    return _request(tenant_id, INTEGRATE)


def request_sealing(tenant_id: int) -> bool:
    """Queue a seal pass over the tenant's new leaves (coalesced, see `_request`)."""
    return _request(tenant_id, SEAL)


def request_cosigning(tenant_id: int) -> bool:
    """Queue a cosigning pass: the latest checkpoint to the tenant's witnesses (coalesced)."""
    return _request(tenant_id, COSIGN)


def _take_request(tenant_id: int, kind: Kind = INTEGRATE) -> None:
    try:
        cache.delete(_request_key(tenant_id, kind))
    except Exception:  # the cache is down: the request expires by itself, and this run goes on
        log.warning("%s of tenant %s: could not clear its request", kind, tenant_id, exc_info=True)


def _claim_key(tenant: Tenant, kind: Kind = INTEGRATE) -> str:
    # Tagged with the tenant's creation time: a database re-created beside a Redis that outlived
    # it (each test run) never finds a previous tenant's claim under a reused id.
    return f"transparency:{kind}-claimed:{tenant.pk}:{tenant.created_at.timestamp():.6f}"


def _claim(tenant: Tenant, token: str, kind: Kind = INTEGRATE) -> bool:
    """Become the tenant's one running `kind` worker, unless another is. Without the cache, every
    caller proceeds: the row lock still serialises them, only the coalescing is lost."""
    try:
        return bool(cache.add(_claim_key(tenant, kind), token, timeout=INTEGRATOR_CLAIM_TTL))
    except Exception:
        log.warning("%s of tenant %s: could not claim it", kind, tenant.pk, exc_info=True)
        return True


def _renew(tenant: Tenant, token: str, kind: Kind = INTEGRATE) -> None:
    try:
        cache.set(_claim_key(tenant, kind), token, timeout=INTEGRATOR_CLAIM_TTL)
    except Exception:
        log.warning("%s of tenant %s: could not renew its claim", kind, tenant.pk, exc_info=True)


def _release(tenant: Tenant, token: str, kind: Kind = INTEGRATE) -> None:
    try:
        if cache.get(_claim_key(tenant, kind)) == token:  # not a claim that lapsed and was taken over
            cache.delete(_claim_key(tenant, kind))
    except Exception:  # it lapses by itself
        log.warning("%s of tenant %s: could not release its claim", kind, tenant.pk, exc_info=True)


def _requested(tenant_id: int, kind: Kind = INTEGRATE) -> bool:
    try:
        return bool(cache.get(_request_key(tenant_id, kind)))
    except Exception:
        return False  # the beat finds the grown log


def integrate_fully(
    tenant: Tenant, *, max_leaves: int | None = None, keep_going: Callable[[], bool] = always
) -> Checkpoint | None:
    """Integrate until the tree holds every leaf assigned when the last round read the log (a
    backlog takes several rounds), or until `keep_going()` says stop: it is asked between rounds.
    Each round is a transaction of its own as the tenant (`services.integrate_round`), so each
    checkpoint is committed, and the TreeState lock let go, before the next round. No empty round
    to find out it is done: one transaction (and its lock) fewer per call, which under sustained
    ingest is one per integrator pass."""
    latest = None
    while keep_going():
        with tenant_context(tenant):
            checkpoint, caught_up = services.integrate_round(tenant, max_leaves)
        latest = checkpoint or latest
        if checkpoint is None or caught_up:
            break
    return latest


def seal_pending(
    tenant: Tenant, *, max_leaves: int | None = None, keep_going: Callable[[], bool] = always
) -> list[str]:
    """Seal passes, each a transaction of its own as the tenant, until the watermark reaches the
    log's size as a pass read it (or `keep_going()`, asked between passes, says stop); the saga
    ids sealed."""
    sealed: list[str] = []
    done = False
    while not done and keep_going():
        with tenant_context(tenant):
            more, done = services.seal_pass(tenant, max_leaves=max_leaves)
        sealed.extend(more)
    return sealed


def _integrated_size(tenant: Tenant) -> int:
    with tenant_context(tenant):
        return TreeState.objects.values_list("size", flat=True).first() or 0


def _coalesced(
    tenant: Tenant, kind: Kind, one_pass: Callable[[Tenant], bool], progress: Callable[[Tenant], str]
) -> bool:
    """Run `one_pass` as the tenant's one `kind` worker until no backlog or request is left.
    Returns False when another worker holds the claim (this call did nothing), else True.

    A call that finds another running returns at once and leaves its request standing; the
    running one checks for a request after each pass and before it lets go, and runs again if it
    finds one, so whatever committed meanwhile is handled by it: under sustained ingest one worker
    loops, each pass taking everything committed so far, instead of tasks queueing on a row lock.
    A pass that returns True left a backlog: the next runs at once, not at the next beat. A worker
    shutting down stops between passes, logs how far it got (`progress`) and requests the rest."""
    token = uuid.uuid4().hex
    while keep_going():
        if not _claim(tenant, token, kind):
            return False  # the running worker sees the request
        try:
            while True:
                _take_request(tenant.pk, kind)
                backlog = one_pass(tenant)
                if not keep_going() or not (backlog or _requested(tenant.pk, kind)):
                    break
                _renew(tenant, token, kind)
        finally:
            _release(tenant, token, kind)
        # A request made after the last check, whose task found the claim still held and left.
        if not _requested(tenant.pk, kind):
            break
    if not keep_going():
        log.warning(
            "%s of tenant %s stopped at %s: the worker is shutting down", kind, tenant.slug, progress(tenant)
        )
        try:
            _request(tenant.pk, kind)  # for the next worker
        except Exception:  # the beat finds the unfinished log anyway
            log.warning("%s of tenant %s: could not request the rest", kind, tenant.slug, exc_info=True)
    return True


@shared_task(name="transparency.integrate_tenant", ignore_result=True)
@tenant_task(transaction=False)  # each pass its own transactions
def integrate_tenant(tenant: Tenant) -> int:
    """Integrate the tenant's accepted leaves (records and seals alike) and sign one checkpoint
    per pass (a backlog larger than an integration chunk signs one per chunk). Sealing is not
    this task's: `seal_tenant` runs beside it and requests an integration when it appended seals.
    Returns the signed size.

    A worker shutting down stops this between chunks (each committed and signed) and the rest is
    requested again, for the next worker. Coalesced per tenant (`_coalesced`)."""
    _coalesced(tenant, INTEGRATE, _integrate_pass, lambda t: f"{_integrated_size(t)} leaves")
    return _integrated_size(tenant)


def _integrate_pass(tenant: Tenant) -> bool:
    """One integrator pass: everything accepted so far, under one checkpoint per chunk. Never
    leaves a backlog of its own (it rounds until caught up), so returns False."""
    try:
        with timing.phase("integrate"):
            signed = integrate_fully(tenant, keep_going=keep_going)
    except services.IntegrationRefused:
        # Never sign what cannot be proven; this needs a human, loudly.
        log.critical("transparency log of tenant %s: integration refused", tenant.slug, exc_info=True)
        raise
    if signed is not None and _has_witnesses(tenant):
        try:
            request_cosigning(tenant.pk)  # after the commit: the witnesses never hold up signing
        except Exception:  # the beat finds the witnesses behind
            log.warning("tenant %s: could not request cosigning", tenant.slug, exc_info=True)
    return False


def _has_witnesses(tenant: Tenant) -> bool:
    with tenant_context(tenant):
        return Witness.objects.exists()


def cosign_pass(tenant: Tenant) -> list[cosigning.Outcome]:
    """Ask every due witness about the latest checkpoint at once; a 409 naming a size at most the
    checkpoint's is asked again from there (twice at most); then record every final answer. The
    requests wait on the network with no transaction open; what they need is read, and each
    answer recorded, in a short transaction of its own as the tenant."""
    with tenant_context(tenant):
        jobs = cosigning.plan(tenant)
    final: list[cosigning.Outcome] = []
    for _ in range(3):
        if not jobs:
            break
        with ThreadPoolExecutor(max_workers=min(len(jobs), 8), thread_name_prefix="cosign") as pool:
            outcomes = list(pool.map(cosigning.ask, jobs))
        jobs = []
        for outcome in outcomes:
            told, job = outcome.told, outcome.job
            if told is not None and told != job.old and told <= job.size:
                with tenant_context(tenant):
                    jobs.append(cosigning.asked_again(tenant, job, told))
            else:
                final.append(outcome)
    final.extend(cosigning.Outcome(job, 409, detail="the witness kept naming another size") for job in jobs)
    for outcome in final:
        with tenant_context(tenant):
            cosigning.record(tenant, outcome)
    return final


@shared_task(name="transparency.cosign_tenant", ignore_result=True)
@tenant_task(transaction=False)  # each pass its own transactions
def cosign_tenant(tenant: Tenant) -> int:
    """Send the latest checkpoint to every witness that has not cosigned it and keep the answers
    (`transparency.cosigning`). Coalesced per tenant like the integrator: a pass requested while
    one runs is taken by it, so however many checkpoints were signed meanwhile, the next pass sends
    only the latest (with a proof from each witness's size). Returns how many cosigned."""
    cosigned = 0

    def one_pass(tenant: Tenant) -> bool:
        nonlocal cosigned
        with timing.phase("cosign"):
            cosigned += sum(1 for o in cosign_pass(tenant) if o.status == 200 and o.line)
        return False

    _coalesced(tenant, COSIGN, one_pass, lambda t: f"{cosigned} cosignatures")
    return cosigned


@shared_task(name="transparency.seal_tenant", ignore_result=True)
@tenant_task(transaction=False)  # each pass its own transactions
def seal_tenant(tenant: Tenant) -> int:
    """Seal the sagas the tenant's new leaves finished (seal passes off the seal watermark, each
    one transaction under the SealState lock, beside the integrator). When a pass appended seals
    it requests an integration: the seals are leaves to sign. Returns how many seals this call
    appended (0 also when another sealer was running; it takes this call's request).

    A crash between sealing and signing is healed by the beat (`integrate_grown_tenants`), which
    finds the unintegrated seals like any other leaves; a crash mid-pass rolls back whole and the
    beat finds the watermark behind the log."""
    appended = 0

    def one_pass(tenant: Tenant) -> bool:
        nonlocal appended
        with hooks.sealer_appending(), timing.phase("seal_pass"), tenant_context(tenant):
            sealed, sealed_up = services.seal_pass(tenant)
        if sealed:
            appended += len(sealed)
            try:
                request_integration(tenant.pk)
            except Exception:  # the seals are committed: the beat finds them unintegrated
                log.warning(
                    "sealing of tenant %s: could not request their signing", tenant.slug, exc_info=True
                )
        return not sealed_up

    _coalesced(tenant, SEAL, one_pass, lambda t: f"{appended} seals appended")
    return appended


@shared_task(name="transparency.integrate_grown_tenants", ignore_result=True)
def integrate_grown_tenants() -> list[int]:
    """Beat, every second: seal each tenant whose log has leaves past its seal watermark, and
    integrate each whose log has unintegrated leaves (seals just appended included). Two indexed
    queries, no scan of sagas. Heals a crash anywhere between ingest, seal and sign."""
    to_seal = set(services.tenants_to_seal())
    tenant_ids = sorted(to_seal | set(services.tenants_to_integrate()))
    for tenant_id in tenant_ids:
        if not keep_going():
            break  # the next beat, on another worker, picks the rest up
        try:
            if tenant_id in to_seal:
                seal_tenant(tenant_id)
            # Also when only sealing was due: the seals it appended are leaves to sign now, not
            # at the next beat (its own request may sit behind this beat on a busy worker).
            integrate_tenant(tenant_id)
        except services.IntegrationRefused:
            continue  # logged; the other tenants still get their checkpoints
    return tenant_ids


@shared_task(name="transparency.sweep_stale_exports", ignore_result=True)
def sweep_stale_exports(now: datetime | None = None) -> dict[str, list[str]]:
    """Beat: re-queue exports whose build went quiet (a worker died mid-build), fail them after
    SAGAPLANE_EXPORT_MAX_ATTEMPTS builds; {"requeued": [...], "failed": [...]}. One cross-tenant
    question, then each stale export in its tenant, one transaction each."""
    outcome: dict[str, list[str]] = {"requeued": [], "failed": []}
    tenants: dict[int, Tenant | None] = {}
    for tenant_id, export_id in services.stale_exports(now):
        tenant = (
            tenants[tenant_id]
            if tenant_id in tenants
            else tenants.setdefault(tenant_id, tenant_by_id(tenant_id))
        )
        if tenant is None:
            continue
        with tenant_context(tenant):
            result = services.requeue_or_fail_export(tenant, export_id, now)
        if result is not None:
            outcome[result].append(str(export_id))
    if outcome["requeued"] or outcome["failed"]:
        log.warning("stale exports: re-queued %s, failed %s", outcome["requeued"], outcome["failed"])
    return outcome


@shared_task(name="transparency.build_export", ignore_result=True)
def build_export(export_id: str, tenant_id: int) -> None:
    tenant = tenant_by_id(tenant_id)  # the export's arguments put the tenant second
    if tenant is not None:
        build_export_in(tenant, export_id)


def build_export_in(tenant: Tenant, export_id: Any) -> None:
    """Build and store a WORM export; idempotent and restartable.

    Several short transactions as the tenant (claim, one per chunk of records read, the
    manifest's reads, finish) so progress is visible while it runs. The bundle is built in
    temporary files; the storage publishes it under its final name atomically and write-once, and
    the row is marked done only after that. So a worker killed at any point leaves either no file
    (a retry rebuilds it) or the complete file (a retry adopts it: every attempt builds against
    the same checkpoint and range)."""
    from transparency.storage import get_storage

    try:
        with tenant_context(tenant):
            claim = services.claim_export(tenant, export_id)
    except (services.IntegrationRefused, bundles.BundleUnavailable) as exc:
        # Deterministic refusals (no checkpoint yet, a range outside the log): a retry would only
        # refuse again, so fail it now rather than leave it for the sweep to re-queue forever.
        with tenant_context(tenant):
            services.fail_unclaimed_export(tenant, export_id, str(exc))
        raise
    if claim is None:
        return
    attempt = claim.attempt
    name = services.export_storage_name(tenant, export_id)
    storage = get_storage()
    try:
        if not storage.exists(name):
            _publish_export(tenant, export_id, claim, name)
        sha256 = _stored_sha256(name)
        with tenant_context(tenant):
            services.finish_export(
                tenant,
                export_id,
                attempt,
                status=ExportStatus.DONE,
                storage_name=name,
                sha256=sha256,
                records_done=claim.end - claim.first,
                error="",
            )
    except Exception as exc:
        log.exception("export %s failed (attempt %s)", export_id, attempt)
        with tenant_context(tenant):
            services.finish_export(
                tenant, export_id, attempt, status=ExportStatus.FAILED, error=str(exc)[:2000]
            )
        raise


def _publish_export(tenant: Tenant, export_id: Any, claim: services.ExportClaim, name: str) -> None:
    """The export's bundle, written to temporary files and published under `name` (write-once)."""
    from transparency.storage import get_storage

    def read(start: int, stop: int) -> list[sources.LeafRecord]:
        with tenant_context(tenant):
            return bundles.records_chunk(tenant, start, stop)

    def progress(done: int) -> None:
        with tenant_context(tenant):
            services.record_export_progress(tenant, export_id, claim.attempt, done, claim.end - claim.first)

    with tempfile.TemporaryFile() as records_file:
        sha, heads = bundles.write_records(claim.first, claim.end, records_file, progress, read)
        with tenant_context(tenant):
            manifest = bundles.manifest_for(
                tenant, claim.export, claim.checkpoint, claim.previous, claim.first, claim.end
            )
        manifest.update(records_sha256=sha, stream_heads=heads)
        with bundles.pack_export(records_file, manifest, manifest["checkpoint"]) as archive:
            try:
                get_storage().create(name, archive)
            except FileExistsError:
                # An attempt presumed dead published after all; its file is equivalent.
                log.warning("export %s: adopting the file an earlier attempt published", export_id)


def _stored_sha256(name: str) -> str:
    from transparency.storage import get_storage

    digest = hashlib.sha256()
    with get_storage().open(name) as stored:
        for block in iter(lambda: stored.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
