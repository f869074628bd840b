from django.apps import AppConfig


class ApprovalsConfig(AppConfig):
    name = "approvals"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The gate's approval step: fleet calls it through fleet.hooks and never imports approvals.
        from approvals import services
        from fleet import hooks

        hooks.register_approval_step(services.GateStep())
