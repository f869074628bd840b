from django.apps import AppConfig


class RecoveryConfig(AppConfig):
    """Finishing what a dead agent started: the lease sweep, recovery jobs (claimed with a lease
    and a fencing token by SDK workers or delivered to a tenant's webhook), the human queue and
    "rollback to here"."""

    name = "recovery"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from celery import signals

        from audit import hooks
        from core import metrics
        from recovery import (
            cross_tenant,  # declares the sweep's and /metrics' cross-tenant functions (core/rls.py)
            services,
            sweeper,
        )

        # Registered after the saga projection's (INSTALLED_APPS order): the lease is written in
        # the same ingest transaction, once the projection has folded the same records.
        hooks.on_records_appended(services.watch_appended)
        # On-call's first question about recovery: how much waits for workers and for humans.
        metrics.register_queues("recovery", cross_tenant.queue_depths)
        # The sweep is a thread of the beat process (the one process every deployment runs once,
        # and which runs no tasks), not a queued message a busy worker could starve.
        signals.beat_init.connect(sweeper.on_beat_init, weak=False)
        metrics.register_gauge(
            "recovery_sweep_lag_seconds",
            "Seconds since the recovery sweep last finished a pass over every tenant (+Inf: never)",
            sweeper.lag_series,
        )
