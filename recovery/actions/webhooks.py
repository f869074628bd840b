"""The tenant's webhook: set, deleted, its secret, and waking its deliveries after commit."""

from __future__ import annotations

import uuid

from django.db import transaction
from django.utils import timezone
from sagaplane.events import Event

from core.actionaudit import append_server_record
from core.actors import Actor, stored
from core.postcommit import after_commit
from core.scoping import require_tenant
from recovery.actions.common import claimable
from recovery.inputs import NewWebhook
from recovery.models import (
    Delivery,
    Run,
    Webhook,
)
from tenants.models import Tenant
from transparency.keys import decrypt_seed, encrypt_seed


def set_webhook(tenant: Tenant, new: NewWebhook, *, actor: Actor) -> tuple[Webhook, str]:
    """Deliver compensations (of `new.handlers`, or all) to `new.url` (`new` from `WebhookSet`).
    Returns the webhook and its new signing secret, shown this once."""
    from recovery.webhook import new_secret

    url, handlers = new.url, list(new.handlers)
    secret = new_secret()
    require_tenant(tenant)
    with transaction.atomic():
        existing = Webhook.objects.select_for_update().first()
        old = None if existing is None else {"url": existing.url, "handlers": existing.handlers}
        if existing is not None:
            existing.delete()
        hook = Webhook.objects.create(
            url=url, handlers=handlers, encrypted_secret=encrypt_seed(secret.encode()), actor=stored(actor)
        )
        append_server_record(
            tenant,
            Event.RECOVERY_WEBHOOK_SET,
            {"old": old, "new": {"url": url, "handlers": handlers, "secret": "rotated"}},
            actor=actor,
        )
    return hook, secret


def delete_webhook(tenant: Tenant, *, actor: Actor) -> None:
    require_tenant(tenant)
    with transaction.atomic():
        existing = Webhook.objects.select_for_update().first()
        if existing is None:
            return
        old = {"url": existing.url, "handlers": existing.handlers}
        existing.delete()
        append_server_record(tenant, Event.RECOVERY_WEBHOOK_DELETED, {"old": old, "new": None}, actor=actor)


def webhook_secret(hook: Webhook) -> str:
    return decrypt_seed(hook.encrypted_secret).decode()


def wake_webhooks(tenant: Tenant, run: Run) -> None:
    """Once the caller's transaction commits, wake the run's webhook deliveries that are due: the
    wake is a unit of work of its own, entered by recovery.tasks.wake_deliveries (a transport)."""
    if not run.jobs.filter(delivery=Delivery.WEBHOOK).exists():
        return
    run_id = run.pk

    def wake() -> None:
        from recovery.tasks import wake_deliveries

        wake_deliveries(tenant, run_id)

    after_commit(f"wake webhook deliveries of run {run_id}", wake)


def due_deliveries(tenant: Tenant, run_id: int) -> list[uuid.UUID]:
    """The ids of the run's webhook deliveries that are due, read as the tenant (asserted)."""
    require_tenant(tenant)
    return list(
        claimable(timezone.now(), Delivery.WEBHOOK).filter(run_id=run_id).values_list("pk", flat=True)
    )


def enqueue_delivery(tenant_id: int, job_id: uuid.UUID) -> None:
    from recovery.tasks import deliver_webhook

    deliver_webhook.delay(tenant_id, str(job_id))
