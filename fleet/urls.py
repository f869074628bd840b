from django.urls import path

from fleet import api, breaker_api

urlpatterns = [
    path("gate/evaluate", api.GateEvaluateView.as_view(), name="gate-evaluate"),
    path("gate/leases", api.GateLeaseView.as_view(), name="gate-leases"),
    path("gate/leases/<uuid:lease_id>/return", api.GateLeaseReturnView.as_view(), name="gate-lease-return"),
    path(
        "gate/reservations/<uuid:reservation_id>/settle",
        api.GateReservationSettleView.as_view(),
        name="gate-reservation-settle",
    ),
    path("fleet/status", api.FleetStatusView.as_view(), name="fleet-status"),
    path("fleet/budgets", api.BudgetListView.as_view(), name="fleet-budgets"),
    path("fleet/budgets/<id:budget_id>", api.BudgetDetailView.as_view(), name="fleet-budget"),
    path("fleet/rate-limits", api.RateLimitListView.as_view(), name="fleet-rate-limits"),
    path("fleet/rate-limits/<id:rate_limit_id>", api.RateLimitDetailView.as_view(), name="fleet-rate-limit"),
    path("fleet/breakers", breaker_api.BreakerListView.as_view(), name="fleet-breakers"),
    path("fleet/breakers/<id:breaker_id>", breaker_api.BreakerDetailView.as_view(), name="fleet-breaker"),
    path("fleet/settings", breaker_api.FleetSettingsView.as_view(), name="fleet-settings"),
    path("fleet/halts", api.HaltListView.as_view(), name="fleet-halts"),
    path("fleet/halts/<id:halt_id>", api.HaltDetailView.as_view(), name="fleet-halt"),
    path("sagas/<str:saga_id>/quarantine", api.QuarantineView.as_view(), name="saga-quarantine"),
]
