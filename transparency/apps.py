from django.apps import AppConfig


class TransparencyConfig(AppConfig):
    """The per-tenant transparency log: leaves, tree nodes, signed checkpoints, proofs,
    disclosures and exports. A bounded context of its own: it reads leaves through
    `transparency.sources` and never writes the record store except through audit's services."""

    name = "transparency"
    default_auto_field = "django.db.models.BigAutoField"
