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
            cross_tenant,  # noqa: F401  (declares the workers' cross-tenant functions, core/rls.py)
            hooks,
        )

        audit_hooks.after_records_committed(hooks.records_committed)
        _register_witness_metrics()
        # Cosigning's liveness: a thread of the beat process, not a queued message busy workers
        # could starve (transparency/cosigner.py).
        from celery import signals

        from transparency import cosigner

        signals.beat_init.connect(cosigner.on_beat_init, weak=False)


_REFUSAL_CODES = {
    0: "unreachable",
    200: "bad_cosignature",
    400: "400",
    403: "403",
    404: "404",
    409: "409",
    422: "422",
}


def _register_witness_metrics() -> None:
    from core import metrics
    from transparency import cross_tenant

    metrics.register_gauge(
        "witness_lag_seconds",
        "Age of the oldest signed checkpoint some witness has not cosigned yet, all tenants (0: none)",
        lambda: [({}, cross_tenant.witness_lag_seconds())],
    )

    def refusals() -> list[tuple[dict[str, str], float]]:
        counts: dict[str, float] = {}
        for status, count in cross_tenant.witness_refusals().items():
            code = _REFUSAL_CODES.get(status, "other")
            counts[code] = counts.get(code, 0.0) + count
        return [({"code": code}, value) for code, value in sorted(counts.items())]

    metrics.register_gauge(
        "witness_refusals",
        "Witness answers that were not a cosignature, kept, all tenants, by code (HTTP status; "
        "unreachable; bad_cosignature: a 200 without a valid one; 422: an inconsistent checkpoint)",
        refusals,
        labels=("code",),
    )
