"""What every policy change of the fleet shares: its error, the create and delete of a policy with
its record, and the change signal."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from django.db import IntegrityError, transaction

from core import epoch
from core.actionaudit import append_server_record
from core.actors import Actor
from core.errors import DomainError
from core.scoping import require_tenant
from fleet.actions.snapshot import forget_policies
from fleet.models import BudgetLimit, CircuitBreaker, RateLimit
from tenants.models import Tenant

# ------------------------------------------------------------------------------------- change signal


def version_key(tenant_id: int) -> str:
    """The tenant's change counter (`core.epoch`): fleet status long-polls wait on it, every
    process' gate compares its policy snapshot against it."""
    return epoch.key(tenant_id)


def changed_after_commit(tenant: Tenant) -> None:
    """Wake every long-poll of the tenant's fleet status once the change commits (best effort:
    waiters re-read the state every second anyway), and make every process' gate re-read the
    tenant's policies on its next decision (this one at once)."""
    forget_policies(tenant)
    epoch.bump_after_commit(tenant.pk, "fleet status change signal")


def policies_changed(tenant: Tenant) -> None:
    """Another app's policy that the gate or the fleet status reads changed (approval policies
    add governed tools): the same signal as a change here, once the change commits."""
    changed_after_commit(tenant)


Policy = TypeVar("Policy", BudgetLimit, RateLimit, CircuitBreaker)


def create_policy(
    tenant: Tenant,
    model: type[Policy],
    fields: dict[str, Any],
    *,
    actor: Actor,
    event: str,
    subject: str,
    values: Callable[[Policy], dict[str, Any]],
) -> Policy:
    """Create one budget or rate limit and record it (one transaction). The unique name is the
    database's to check: a name taken, even by a creation racing this one, is a 409."""
    require_tenant(tenant)
    with transaction.atomic():
        try:
            with transaction.atomic():  # a savepoint: the refused INSERT must not spoil the rest
                limit = model.objects.create(**fields)
        except IntegrityError:
            taken = f"a {subject.replace('_', ' ')} named '{fields['name']}' exists"
            raise DomainError("name_taken", taken, status=409, field="name") from None
        record = {subject: limit.pk, "old": None, "new": values(limit)}
        append_server_record(tenant, event, record, actor=actor)
        changed_after_commit(tenant)
    return limit


def update_policy(
    tenant: Tenant,
    model: type[Policy],
    pk: int,
    fields: dict[str, Any],
    *,
    actor: Actor,
    event: str,
    subject: str,
    values: Callable[[Policy], dict[str, Any]],
) -> Policy:
    """Set every field of one budget or rate limit (its name stays: the ledger's debits and the
    denials name it) and record old and new values (one transaction); nothing changed: nothing
    recorded. The gate re-reads the tenant's policies once it commits."""
    what = subject.replace("_", " ")
    require_tenant(tenant)
    with transaction.atomic():
        limit = model.objects.select_for_update().filter(pk=pk).first()
        if limit is None:
            raise DomainError("not_found", f"no such {what}", status=404, field="id")
        old = values(limit)
        for name, value in fields.items():
            if name != "name":
                setattr(limit, name, value)
        new = values(limit)
        if new == old:
            return limit
        limit.save()
        append_server_record(tenant, event, {subject: pk, "old": old, "new": new}, actor=actor)
        changed_after_commit(tenant)
    return limit


def delete_policy(
    tenant: Tenant,
    model: type[BudgetLimit] | type[RateLimit] | type[CircuitBreaker],
    pk: int,
    *,
    actor: Actor,
    event: str,
    subject: str,
    values: Callable[[Any], dict[str, Any]],
) -> None:
    """Delete one budget or rate limit, recording what it was (one transaction)."""
    require_tenant(tenant)
    with transaction.atomic():
        limit = model.objects.select_for_update().filter(pk=pk).first()
        if limit is None:
            raise DomainError("not_found", f"no such {subject.replace('_', ' ')}", status=404, field="id")
        old = values(limit)
        limit.delete()
        append_server_record(tenant, event, {subject: pk, "old": old, "new": None}, actor=actor)
        changed_after_commit(tenant)
