from csp.decorators import csp_update
from django.contrib import admin
from django.templatetags.static import static
from django.urls import include, path, register_converter
from django.utils.functional import lazy
from django.views.generic import RedirectView
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView, SpectacularSwaggerSplitView

from controlplane import health, observability
from core.numbers import IdConverter

# Before any app's URLconf is included: their routes name it (`<id:...>`).
register_converter(IdConverter, "id")

docs_csp = csp_update({"style-src": ["'unsafe-inline'"], "worker-src": ["blob:"]})

urlpatterns = [
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("metrics", observability.metrics_view, name="metrics"),
    # Pages name their icon; a browser that asks the conventional place anyway is sent to it.
    path(
        "favicon.ico",
        # Lazy: the hashed name is read from the manifest at the first request, not at import
        # (`manage.py migrate` imports the URLs before `collectstatic` has written the manifest).
        RedirectView.as_view(
            url=lazy(static, str)("frontend/favicon.svg"), permanent=True, http_method_names=["get", "head"]
        ),
        name="favicon",
    ),
    path("admin/", admin.site.urls),
    path("api/schema", SpectacularAPIView.as_view(), name="schema"),
    # The API reference pages' bundles inject their own styles (never scripts): relax style-src there only.
    path("api/docs", docs_csp(SpectacularSwaggerSplitView.as_view(url_name="schema")), name="api-docs"),
    path("api/redoc", docs_csp(SpectacularRedocView.as_view(url_name="schema")), name="api-redoc"),
    path("api/v1/", include("tenants.urls")),
    path("api/v1/audit/", include("transparency.urls")),
    path("api/v1/", include("audit.urls")),
    path("api/v1/", include("sagas.urls")),
    path("api/v1/", include("fleet.urls")),
    path("api/v1/", include("recovery.urls")),
    path("api/v1/", include("approvals.urls")),
    path("api/v1/", include("reconciliation.urls")),
    path("v1/", include("audit.compat_urls")),
    path("v1/", include("sagas.compat_urls")),
    path("v1/", include("fleet.compat_urls")),
    path("v1/", include("approvals.compat_urls")),
    path("slack/", include("slackapp.urls")),
    path("", include("frontend.urls")),
]

# An error no view handled: a store that cannot be reached is a 503 that says so (frontend/errors.py).
handler500 = "frontend.errors.server_error"
