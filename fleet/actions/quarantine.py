"""Setting one saga aside (the gate refuses its steps; recovery skips it), recorded."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from sagaplane.events import Event

from core.actionaudit import append_server_record
from core.actors import Actor, stored
from core.errors import DomainError
from core.scoping import require_tenant
from fleet.actions.changes import changed_after_commit
from fleet.inputs import QuarantineTerms
from fleet.models import Quarantine
from sagas import selectors as saga_selectors
from tenants.models import Tenant


def refuse_unknown_saga(saga_id: Any, *, preemptive: bool) -> bool:
    """Whether no record has named `saga_id` yet; such a saga is refused (404 `saga_not_found`,
    before its body is judged) unless `preemptive` asks for exactly that. In the tenant's scope."""
    if not isinstance(saga_id, str) or not 0 < len(saga_id) <= 128 or "\x00" in saga_id:
        raise DomainError("invalid_saga_id", "saga_id must be 1 to 128 characters", field="saga_id")
    unknown = saga_selectors.saga(saga_id) is None
    if unknown and not preemptive:
        raise DomainError(
            "saga_not_found",
            "no record names this saga yet; send preemptive: true to set it aside before it starts",
            status=404,
            field="saga_id",
        )
    return unknown


def quarantine(tenant: Tenant, saga_id: Any, terms: QuarantineTerms, *, actor: Actor) -> Quarantine:
    """Set one saga aside (the gate refuses its steps; recovery will skip it). A saga no record
    has named yet is refused (404 `saga_not_found`) unless `preemptive` asks for exactly that: the
    quarantine then stands for the saga when it arrives, and says it was preemptive."""
    require_tenant(tenant)
    with transaction.atomic():
        unknown = refuse_unknown_saga(saga_id, preemptive=terms.preemptive)
        reason = terms.reason
        existing = Quarantine.objects.filter(saga_id=saga_id, released_at__isnull=True).first()
        if existing is not None:
            return existing
        row = Quarantine.objects.create(
            saga_id=saga_id, reason=reason, actor=stored(actor), preemptive=unknown
        )
        append_server_record(
            tenant,
            Event.SAGA_QUARANTINED,
            {
                "saga_id": saga_id,
                "old": None,
                "new": {"quarantined": True, "reason": reason, "preemptive": unknown},
            },
            actor=actor,
        )
        changed_after_commit(tenant)
    return row
