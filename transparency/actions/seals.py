"""Saga seals: when a saga reaches a terminal state, one record in the server stream naming its
leaves, appended by the seal pass beside the integrator (its own watermark and lock) and signed by
whichever integration round first reads the log past it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from audit.jsonvalues import index_text
from core import timing
from core.scoping import require_tenant
from tenants.actors import system_actor
from tenants.models import Tenant
from transparency import cross_tenant, sources
from transparency.actions.common import locked_row
from transparency.models import SealState

SEAL_EVENT = sources.SEAL_EVENT


class SagaRecord(Protocol):
    """A record of a saga at its leaf: a `sources.LeafRecord`, or the lean `sources.SealInput`."""

    @property
    def leaf_index(self) -> int: ...

    @property
    def record(self) -> dict[str, Any]: ...


def exact_saga_id(records: Sequence[SagaRecord], saga_id: str) -> str:
    """The saga id as its records carry it. `saga_id` is the index copy the projection and the
    URLs use (audit.jsonvalues: a NUL in an id becomes U+FFFD there); seals and disclosures name
    the exact id, which is what a verifier compares with each record's `saga_id`."""
    for leaf in records:
        sent = leaf.record.get("saga_id")
        if isinstance(sent, str) and index_text(sent) == saga_id:
            return sent
    return saga_id


def _seal_fields(records: Sequence[SagaRecord], saga_id: str) -> tuple[dict[str, Any], bool]:
    """(the seal a saga needs now, whether its latest seal already says exactly that)."""
    own = [r for r in records if r.record.get("event") != SEAL_EVENT]
    seals = [r for r in records if r.record.get("event") == SEAL_EVENT]
    leaves = [[r.leaf_index, r.record.get("_h")] for r in own]
    fields = {"saga_id": exact_saga_id(own, saga_id), "leaves": leaves, "count": len(leaves)}
    current = bool(seals) and seals[-1].record.get("leaves") == leaves
    return fields, current


SEAL_ACTOR = system_actor("transparency")


def _seal_stretch(tenant: Tenant, start: int, end: int) -> tuple[list[str], int | None]:
    """Seal every saga that has a record among leaves [start, end) and is in a terminal state: (the
    saga ids sealed, the leaf index of the first seal appended, None when none was).

    In bulk: the sagas' records read by leaf range (`sources.seal_inputs`), and every seal the
    pass needs appended to the server stream as one batch (one lock, one set-based store), not
    one read and one append per saga. What each seal says is `_seal_fields`'s rule."""
    with timing.phase("seal_find"):
        sagas = sources.terminal_sagas_touched(tenant, start, end)
    with timing.phase("seal_read"):
        by_saga = sources.seal_inputs(tenant, sagas, start, end) if sagas else {}
    sealed: list[str] = []
    seals: list[tuple[str, dict[str, Any]]] = []
    with timing.phase("seal_compute"):
        for saga_id in sagas:
            records = by_saga.get(saga_id)
            if not records:
                continue
            fields, current = _seal_fields(records, saga_id)
            if not current:
                sealed.append(saga_id)
                seals.append((SEAL_EVENT, fields))
    if not seals:
        return sealed, None
    # The append's own phases (rows, insert_payloads, projection_*, insert_locked) nest inside.
    with timing.phase("seal_append"):
        return sealed, sources.append_server_records(tenant, seals, actor=SEAL_ACTOR)


# One seal pass looks at most this many integrated leaves, so catching up on a long unsealed
# stretch (a backlog, or a log integrated before the watermark existed) is bounded per transaction.
SEAL_PASS_LEAVES = 50_000


def _locked_seal_state(tenant: Tenant) -> SealState:
    """The tenant's seal watermark, row-locked: what serialises seal passes. Not
    TreeState's lock, which the integrator holds while it extends and signs: sealing and
    integration run beside each other. Lock order: this row, then the tenant log (the seals'
    append); the integrator takes TreeState alone, ingest the tenant log alone, so no cycle."""
    return locked_row(SealState, tenant)


def seal_pass(tenant: Tenant, *, max_leaves: int | None = None) -> tuple[list[str], bool]:
    """Seal the sagas finished by leaves past the tenant's seal watermark, then move the
    watermark: (saga ids sealed, whether the watermark has reached the log's size).

    The watermark follows the log, not the tree: a pass seals what has been accepted, whether or
    not it is integrated yet, so a seal often lands before its records are signed and one
    checkpoint covers both. When the
    seals landed right at the watermark (no ingest committed in between) it moves over them too:
    they are current by construction, and nothing else is left to look at.

    Self-healing by construction: the watermark (`SealState.sealed_size`) moves in the same
    transaction as the seals it vouches for, so a crash anywhere before that commit leaves the
    watermark behind and the next pass (the 1 s beat) redoes the stretch. Re-running is harmless:
    `_seal_fields`'s rule appends nothing when the latest seal is current. Only sagas with a record
    in the stretch are looked at; a saga can only become finished, or outgrow its seal, through a
    new record, so nothing before the watermark needs a second look.

    Runs beside the integrator (its own lock, `_locked_seal_state`): the integrator signs the
    seals in whichever of its rounds first reads the log past them. One pass, in the caller's
    transaction (the tenant's, entered by the sealer task for each pass)."""
    require_tenant(tenant)
    # The SealState lock serialises seal passes per tenant, nothing else.
    state = _locked_seal_state(tenant)
    size = sources.log_size(tenant)
    if state.sealed_size >= size:
        return [], True
    start, end = state.sealed_size, min(size, state.sealed_size + (max_leaves or SEAL_PASS_LEAVES))
    sealed, first_seal = _seal_stretch(tenant, start, end)
    if first_seal == end:
        end += len(sealed)
    SealState.objects.filter(pk=state.pk).update(sealed_size=end)
    return sealed, end >= size


def tenants_to_seal() -> list[int]:
    """Ids of tenants with accepted leaves the seal pass has not looked at yet (or no watermark
    yet): what the beat seals, whether or not the leaves are integrated."""
    return cross_tenant.tenants_to_seal()
