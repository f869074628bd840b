from django.apps import AppConfig


class FleetConfig(AppConfig):
    name = "fleet"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from audit import hooks as audit_hooks
        from fleet.actions import breaker_states, reservations

        # Circuit breakers count the step outcomes agents ship, once their batch has committed.
        audit_hooks.after_records_committed(breaker_states.outcomes_committed)
        # Settlements and saga ends shipped in agents' WALs settle reservations, in the ingest's
        # transaction (an accepted record is never lost).
        audit_hooks.on_records_appended(reservations.records_appended)
