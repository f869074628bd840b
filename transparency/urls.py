"""Routed from controlplane/urls.py under api/v1/audit/."""

from django.urls import path

from transparency import api, witness_api

urlpatterns = [
    path("checkpoint", api.CheckpointView.as_view(), name="audit-checkpoint"),
    path("key", api.KeyView.as_view(), name="audit-key"),
    path("proofs/inclusion", api.InclusionProofView.as_view(), name="audit-proof-inclusion"),
    path("proofs/consistency", api.ConsistencyProofView.as_view(), name="audit-proof-consistency"),
    path("proofs/bundle", api.ProofBundleView.as_view(), name="audit-proof-bundle"),
    path("tile/entries/<path:bundle>", api.EntryBundleView.as_view(), name="audit-entry-bundle"),
    path("tile/<id:level>/<path:tile>", api.TileView.as_view(), name="audit-tile"),
    path("sagas/<str:saga_id>/disclosure", api.DisclosureView.as_view(), name="audit-saga-disclosure"),
    path("witnesses", witness_api.WitnessListView.as_view(), name="audit-witnesses"),
    path("witnesses/quorum", witness_api.WitnessQuorumView.as_view(), name="audit-witness-quorum"),
    path(
        "witnesses/checkpoints",
        witness_api.WitnessCheckpointsView.as_view(),
        name="audit-witness-checkpoints",
    ),
    path("witnesses/policy", witness_api.WitnessPolicyView.as_view(), name="audit-witness-policy"),
    path("witnesses/<id:witness_id>", witness_api.WitnessDetailView.as_view(), name="audit-witness"),
    path("exports", api.ExportListView.as_view(), name="audit-exports"),
    path("exports/<uuid:export_id>", api.ExportDetailView.as_view(), name="audit-export"),
    path("exports/<uuid:export_id>/download", api.ExportDownloadView.as_view(), name="audit-export-download"),
]
