"""A tenant's witnesses and quorum (state changes, each audited in its own transaction), and what
the log serves with their cosignatures: the cosigned checkpoint note, the newest checkpoint the
quorum cosigned, and the tenant's C2SP tlog-policy file.

Witnesses are C2SP tlog-witnesses (`sagaplane witness serve` or any other); `cosigning` talks
to them. Their URLs pass the outbound-address guard when configured and again at each request."""

from __future__ import annotations

from typing import Any

from django.db import IntegrityError, transaction
from sagaplane import policy
from sagaplane.events import Event

from core.actionaudit import append_server_record
from core.actors import Actor
from core.errors import DomainError
from core.scoping import require_tenant
from tenants.models import Tenant
from transparency import keys

# The commands' inputs, re-exported for the pages (which reach witnesses through this module).
from transparency.inputs import NewWitness as NewWitness
from transparency.inputs import Quorum as Quorum
from transparency.inputs import QuorumSet as QuorumSet
from transparency.inputs import WitnessAdd as WitnessAdd
from transparency.models import Checkpoint, Cosignature, Witness, WitnessQuorum, WitnessRefusal

MAX_WITNESSES = 32  # tlog-policy implementations must support at least 32 witnesses


def _witness_values(witness: Witness) -> dict[str, Any]:
    return {"name": witness.name, "url": witness.url, "vkey": witness.vkey}


def add_witness(tenant: Tenant, new: NewWitness, *, actor: Actor) -> Witness:
    """Send the tenant's checkpoints to this witness from now on (its first request starts at 0);
    `new` from `WitnessAdd`."""
    name, url, vkey = new.name, new.url, new.vkey
    require_tenant(tenant)
    with transaction.atomic():
        if Witness.objects.count() >= MAX_WITNESSES:
            raise DomainError(
                "too_many_witnesses", f"a tenant has at most {MAX_WITNESSES} witnesses", status=409
            )
        if Witness.objects.filter(vkey=vkey).exists():
            raise DomainError(
                "duplicate_witness", "vkey: this key is already one of the witnesses", status=409
            )
        try:
            with transaction.atomic():
                witness = Witness.objects.create(tenant=tenant, name=name, url=url, vkey=vkey)
        except IntegrityError:
            raise DomainError(
                "duplicate_witness", f"name: a witness is already named {name}", status=409
            ) from None
        append_server_record(
            tenant, Event.ADMIN_WITNESS_ADDED, {"old": None, "new": _witness_values(witness)}, actor=actor
        )
    return witness


def remove_witness(tenant: Tenant, witness_id: int, *, actor: Actor) -> None:
    """Stop asking this witness; its past cosignatures stay on the checkpoints they signed. The
    quorum is lowered to the witnesses left, if it was above (recorded with the removal)."""
    require_tenant(tenant)
    with transaction.atomic():
        witness = Witness.objects.select_for_update().filter(pk=witness_id).first()
        if witness is None:
            raise DomainError("not_found", "no such witness in this tenant", status=404)
        old = {"witness": _witness_values(witness), "quorum": _quorum_row(tenant).quorum}
        witness.delete()
        row = _quorum_row(tenant)
        row.quorum = min(row.quorum, Witness.objects.count())
        row.save(update_fields=["quorum"])
        append_server_record(
            tenant,
            Event.ADMIN_WITNESS_REMOVED,
            {"old": old, "new": {"witness": None, "quorum": row.quorum}},
            actor=actor,
        )


def _quorum_row(tenant: Tenant) -> WitnessQuorum:
    row = WitnessQuorum.objects.select_for_update().filter(tenant=tenant).first()
    return row if row is not None else WitnessQuorum.objects.create(tenant=tenant)


def set_quorum(tenant: Tenant, terms: Quorum, *, actor: Actor) -> int:
    """How many witnesses must cosign (0: none required); at most the number of witnesses.
    `terms` from `QuorumSet`."""
    quorum = terms.quorum
    require_tenant(tenant)
    with transaction.atomic():
        count = Witness.objects.count()
        if quorum > count:
            raise DomainError("invalid", f"quorum: at most the number of witnesses ({count})", field="quorum")
        row = _quorum_row(tenant)
        old = row.quorum
        if old != quorum:
            row.quorum = quorum
            row.save(update_fields=["quorum"])
            append_server_record(
                tenant,
                Event.ADMIN_WITNESS_QUORUM_SET,
                {"old": {"quorum": old}, "new": {"quorum": quorum}},
                actor=actor,
            )
    return quorum


# ----------------------------------------------------------------------------- reads


def quorum() -> int:
    """The active tenant's quorum (0 when never set)."""
    return WitnessQuorum.objects.values_list("quorum", flat=True).first() or 0


def witnesses() -> list[Witness]:
    return list(Witness.objects.order_by("name"))


def recent_refusals(limit: int) -> list[WitnessRefusal]:
    """The latest witness refusals, newest first (a 422 from a witness is a split view caught)."""
    return list(WitnessRefusal.objects.order_by("-id")[:limit])


def cosigned_note(checkpoint: Checkpoint) -> str:
    """The checkpoint's signed note followed by every cosignature gathered for it (a note with
    more signature lines: verifiers ignore those of keys they do not know)."""
    lines = (
        Cosignature.objects.filter(checkpoint=checkpoint)
        .order_by("witness_name")
        .values_list("line", flat=True)
    )
    return checkpoint.note + "".join(lines)


def witnessed_checkpoint() -> Checkpoint | None:
    """The newest checkpoint cosigned by the quorum (the latest one when the quorum is 0): what
    disclosures and proof bundles are proven against, so they verify under the tenant's policy."""
    needed = quorum()
    latest = Checkpoint.objects.order_by("-id").first()
    if needed == 0 or latest is None:
        return latest
    current = set(Witness.objects.values_list("pk", flat=True))
    # Newest first; each witness's cosignatures are on a few recent checkpoints, so this reads little.
    counts: dict[int, int] = {}
    for checkpoint_id in (
        Cosignature.objects.filter(witness_id__in=current)
        .order_by("-checkpoint_id")
        .values_list("checkpoint_id", flat=True)[: 64 * max(len(current), 1)]
    ):
        counts[checkpoint_id] = counts.get(checkpoint_id, 0) + 1
        if counts[checkpoint_id] >= needed:
            return Checkpoint.objects.get(pk=checkpoint_id)
    return None


def proving_checkpoint(leaves: int) -> Checkpoint | None:
    """The checkpoint to prove `leaves` leaves against: the newest the quorum cosigned when it
    covers them, else the latest (whose cosignatures a policy check may then find short)."""
    witnessed = witnessed_checkpoint()
    if witnessed is not None and witnessed.size >= leaves:
        return witnessed
    return Checkpoint.objects.order_by("-id").first()


def policy_text(tenant: Tenant) -> str:
    """The tenant's C2SP tlog-policy: its log keys (retired ones too, to verify old checkpoints),
    its witnesses with their URLs, and the quorum."""
    from transparency import services

    logs = services.current_verifier_keys(include_retired=True)
    rows = [(w.name, w.vkey, w.url) for w in witnesses()]
    return f"# Sagaplane tenant log {keys.log_origin(tenant)}\n" + policy.format_policy(logs, rows, quorum())
