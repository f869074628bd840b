"""agent-saga's `SagaCloudClient.get_fleet_budget`, mounted at /v1/ beside the other compat reads."""

from django.urls import path

from fleet import compat

urlpatterns = [
    path("fleet/budget", compat.FleetBudgetView.as_view(), name="agent-saga-fleet-budget"),
]
