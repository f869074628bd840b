from django.apps import AppConfig


class FleetConfig(AppConfig):
    name = "fleet"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from audit import hooks as audit_hooks
        from fleet.actions import breaker_states

        # Circuit breakers count the step outcomes agents ship, once their batch has committed.
        audit_hooks.after_records_committed(breaker_states.outcomes_committed)
