from django.apps import AppConfig


class RecoveryConfig(AppConfig):
    """Finishing what a dead agent started: the lease sweep, recovery jobs (claimed with a lease
    and a fencing token by SDK workers or delivered to a tenant's webhook), the human queue and
    "rollback to here"."""

    name = "recovery"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from audit import hooks
        from controlplane import metrics
        from recovery import (
            cross_tenant,  # declares the sweep's and /metrics' cross-tenant functions (tenants/rls.py)
            services,
        )

        # Registered after the saga projection's (INSTALLED_APPS order): the lease is written in
        # the same ingest transaction, once the projection has folded the same records.
        hooks.on_records_appended(services.watch_appended)
        # On-call's first question about recovery: how much waits for workers and for humans.
        metrics.register_queues("recovery", cross_tenant.queue_depths)
