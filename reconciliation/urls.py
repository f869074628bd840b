from django.urls import path

from reconciliation import api

urlpatterns = [
    path("reconciliation/claim", api.ClaimView.as_view(), name="reconciliation-claim"),
    path("reconciliation/report", api.RangeReportView.as_view(), name="reconciliation-report"),
    path("reconciliation/answers", api.AnswersView.as_view(), name="reconciliation-answers"),
    path(
        "reconciliation/checks/<str:check_id>/report",
        api.ReportView.as_view(),
        name="reconciliation-check-report",
    ),
    path(
        "reconciliation/checks/<str:check_id>/recheck",
        api.RecheckView.as_view(),
        name="reconciliation-check-recheck",
    ),
    path("audit/certificate", api.CertificateView.as_view(), name="audit-certificate"),
]
