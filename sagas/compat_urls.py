"""agent-saga's `SagaCloudClient` reads that count sagas, mounted at /v1/ beside `audit.compat_urls`."""

from django.urls import path

from sagas import compat

urlpatterns = [
    path("audit/report", compat.AuditReportView.as_view(), name="agent-saga-audit-report"),
]
