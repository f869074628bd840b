from django.apps import AppConfig


class ApprovalsConfig(AppConfig):
    name = "approvals"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The gate's approval step: fleet calls it through fleet.hooks and never imports approvals.
        from approvals import compat, cross_tenant, services
        from audit import hooks as audit_hooks
        from core import metrics
        from fleet import hooks

        hooks.register_approval_step(services.GateStep())
        # agent-saga's APPROVAL_REQUESTED records become requests once their ingest commits.
        audit_hooks.after_records_committed(compat.requests_from_wal)
        # On-call's first question about approvals: how many wait for a human (/metrics).
        metrics.register_queues("approvals", cross_tenant.queue_depths)
