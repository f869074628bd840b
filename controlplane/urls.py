from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView, SpectacularSwaggerView

from controlplane import health

urlpatterns = [
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("admin/", admin.site.urls),
    path("api/schema", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
    path("api/redoc", SpectacularRedocView.as_view(url_name="schema"), name="api-redoc"),
    path("api/v1/", include("tenants.urls")),
    path("api/v1/audit/", include("transparency.urls")),
    path("api/v1/", include("audit.urls")),
    path("api/v1/", include("sagas.urls")),
    path("v1/", include("audit.compat_urls")),
    path("", include("frontend.urls")),
]
