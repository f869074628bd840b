"""Key rotation: a new active key, the old one co-signing until the rotation is finished; each
step recorded in the tenant's server stream in its transaction."""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone
from sagaplane.events import Event

from core.actionaudit import append_server_record
from core.actors import Actor
from core.scoping import require_tenant
from tenants.models import Tenant
from transparency.actions.integration import extend_and_sign, locked_state
from transparency.actions.signing import create_key
from transparency.models import KeyStatus, LogSigningKey


def rotate_signing_key(tenant: Tenant, *, actor: Actor) -> LogSigningKey:
    """A new active key; the old one co-signs ("retiring") until `finish_key_rotation`. The
    current tree is re-signed at once with both keys so the new key is usable immediately.
    Recorded (old and new key ids) in the tenant's server stream, in the same transaction."""
    require_tenant(tenant)
    with transaction.atomic():
        state = locked_state(tenant)
        before = _key_ids_by_status()
        LogSigningKey.objects.filter(status=KeyStatus.RETIRING).update(
            status=KeyStatus.RETIRED, retired_at=timezone.now()
        )
        LogSigningKey.objects.filter(status=KeyStatus.ACTIVE).update(status=KeyStatus.RETIRING)
        new_key = create_key(tenant, KeyStatus.ACTIVE)
        extend_and_sign(tenant, state, target=state.size, force=True)
        append_server_record(
            tenant,
            Event.ADMIN_SIGNING_KEY_ROTATED,
            {"old": before, "new": _key_ids_by_status()},
            actor=actor,
        )
        return new_key


def finish_key_rotation(tenant: Tenant, *, actor: Actor) -> int:
    """Stop co-signing with retiring keys; they stay listed to verify old checkpoints. With no
    rotation under way this is a no-op (0, nothing recorded)."""
    require_tenant(tenant)
    with transaction.atomic():
        before = _key_ids_by_status()
        retired = LogSigningKey.objects.filter(status=KeyStatus.RETIRING).update(
            status=KeyStatus.RETIRED, retired_at=timezone.now()
        )
        if retired:
            append_server_record(
                tenant,
                Event.ADMIN_SIGNING_KEY_ROTATION_FINISHED,
                {"old": before, "new": _key_ids_by_status()},
                actor=actor,
            )
        return retired


def _key_ids_by_status() -> dict[str, list[str]]:
    """The tenant's key ids (hex, as in verifier keys) by status, oldest first: what a rotation
    record shows as its old and new values."""
    out: dict[str, list[str]] = {status: [] for status in KeyStatus.values}
    for key_id, status in LogSigningKey.objects.order_by("pk").values_list("key_id", "status"):
        out[status].append(key_id)
    return out
