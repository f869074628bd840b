from django.apps import AppConfig


class RecoveryConfig(AppConfig):
    """Finishing what a dead agent started: the lease sweep, recovery jobs (claimed with a lease
    and a fencing token by SDK workers or delivered to a tenant's webhook), the human queue and
    "rollback to here"."""

    name = "recovery"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from audit import hooks
        from recovery import (
            cross_tenant,  # noqa: F401  (declares the sweep's cross-tenant function, tenants/rls.py)
            services,
        )

        # Registered after the saga projection's (INSTALLED_APPS order): the lease is written in
        # the same ingest transaction, once the projection has folded the same records.
        hooks.on_records_appended(services.watch_appended)
