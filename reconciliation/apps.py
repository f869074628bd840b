from django.apps import AppConfig


class ReconciliationConfig(AppConfig):
    """Reconciliation: whether each compensated step's effect is really reversed in the world, as
    its observer says (an SDK reconciler or the tenant's webhook), and the signed certificate of a
    range of effects. Reads sagas and records through their selectors; writes only its own rows
    and its verdicts' records in the tenant's server stream."""

    name = "reconciliation"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from core import metrics
        from reconciliation import cross_tenant  # declares the pass's and /metrics' functions

        # On-call's question about reconciliation: how far behind the pass is.
        metrics.register_queues("reconciliation", cross_tenant.queue_depths)
