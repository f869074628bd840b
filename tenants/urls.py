from django.urls import path

from tenants import api

urlpatterns = [
    path("tenant", api.CurrentTenantView.as_view(), name="current-tenant"),
    path("keys", api.ApiKeyListView.as_view(), name="api-key-list"),
    path("keys/<id:pk>", api.ApiKeyDetailView.as_view(), name="api-key-detail"),
    path("members", api.MembershipListView.as_view(), name="member-list"),
]
