from django.apps import AppConfig


class TransparencyConfig(AppConfig):
    """The per-tenant transparency log: leaves, tree nodes, signed checkpoints, proofs,
    disclosures and exports. A bounded context of its own: it reads leaves through
    `transparency.sources` and never writes the record store except through audit's services."""

    name = "transparency"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from audit import hooks as audit_hooks
        from transparency import (
            cross_tenant,  # noqa: F401  (declares the workers' cross-tenant functions, tenants/rls.py)
            hooks,
        )

        audit_hooks.after_records_committed(hooks.records_committed)
