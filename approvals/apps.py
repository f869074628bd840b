from django.apps import AppConfig


class ApprovalsConfig(AppConfig):
    name = "approvals"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The gate's approval step: fleet calls it through fleet.hooks and never imports approvals.
        from approvals import compat, services
        from audit import hooks as audit_hooks
        from fleet import hooks

        hooks.register_approval_step(services.GateStep())
        # agent-saga's APPROVAL_REQUESTED records become requests once their ingest commits.
        audit_hooks.after_records_committed(compat.requests_from_wal)
