from django.urls import path

from audit import api

urlpatterns = [
    path("streams/<str:stream_id>/records", api.StreamRecordsView.as_view(), name="stream-records"),
    path("streams/<str:stream_id>", api.StreamDetailView.as_view(), name="stream-detail"),
    path("audit/redactions", api.RedactionView.as_view(), name="audit-redactions"),
]
