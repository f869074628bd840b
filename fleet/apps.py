from django.apps import AppConfig


class FleetConfig(AppConfig):
    name = "fleet"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from audit import hooks as audit_hooks
        from fleet import cross_tenant  # noqa: F401  declares the settlement's cross-tenant function
        from fleet.actions import agent_denials, lease_settlement, reservations
        from fleet.tasks import outcomes_committed

        # Circuit breakers count the step outcomes agents ship, once their batch has committed
        # (a transport: it enters the tenant around each count and transition).
        audit_hooks.after_records_committed(outcomes_committed)
        # Settlements and saga ends shipped in agents' WALs settle reservations, in the ingest's
        # transaction (an accepted record is never lost).
        audit_hooks.on_records_appended(reservations.records_appended)
        # A lease's decisions the holder's WAL shipped are counted with their records, so a lease
        # its holder never returned is settled at what was shipped.
        audit_hooks.on_records_appended(lease_settlement.watch_appended)
        # Refusals the agent's SDK made on its own (its GATE_DENY records) join the gate's in the
        # denials, in the ingest's transaction.
        audit_hooks.on_records_appended(agent_denials.watch_appended)
