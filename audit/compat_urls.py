"""agent-saga's `SagaCloudClient` paths, mounted at /v1/."""

from django.urls import path

from audit import compat

urlpatterns = [
    path("wal/ingest", compat.WalIngestView.as_view(), name="agent-saga-wal-ingest"),
    path("approvals", compat.ApprovalsView.as_view(), name="agent-saga-approvals"),
    path("fleet/budget", compat.FleetBudgetView.as_view(), name="agent-saga-fleet-budget"),
    path("audit/report", compat.AuditReportView.as_view(), name="agent-saga-audit-report"),
]
