"""agent-saga's `SagaCloudClient.pull_approvals`, mounted at /v1/ beside the other compat reads."""

from django.urls import path

from approvals import compat

urlpatterns = [
    path("approvals", compat.ApprovalsView.as_view(), name="agent-saga-approvals"),
]
