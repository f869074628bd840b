"""What the transparency log's actions share: the integrator's refusal and the per-tenant state
rows that serialise its passes."""

from __future__ import annotations

from typing import TypeVar

from django.db import IntegrityError, transaction

from core.errors import DomainError
from tenants.models import Tenant
from transparency.models import SealState, TreeState


class IntegrationRefused(DomainError):
    """The integrator found stored state it cannot extend consistently; nothing was signed.
    The server's fault, never the client's (a 500 should one reach an API answer). A kind of its
    own: the integrating task catches it apart (raised as `integration_refused`, status 500)."""


def always() -> bool:
    return True


StateRow = TypeVar("StateRow", TreeState, SealState)


def locked_row(model: type[StateRow], tenant: Tenant) -> StateRow:
    """The tenant's one row of `model`, row-locked until the transaction ends (created first if
    the tenant has none yet)."""
    state = model.objects.select_for_update().filter(tenant=tenant).first()
    if state is None:
        try:
            with transaction.atomic():
                model.objects.create(tenant=tenant)
        except IntegrityError:
            pass  # another worker created it first; lock theirs
        state = model.objects.select_for_update().get(tenant=tenant)
    return state
