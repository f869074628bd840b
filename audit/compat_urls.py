"""agent-saga's `SagaCloudClient` paths, mounted at /v1/ (the reads that count sagas are in
`sagas.compat_urls`, mounted beside these)."""

from django.urls import path

from audit import compat

urlpatterns = [
    path("wal/ingest", compat.WalIngestView.as_view(), name="agent-saga-wal-ingest"),
]
