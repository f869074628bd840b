from django.apps import AppConfig
from django.db.models.signals import post_migrate


class TenantsConfig(AppConfig):
    name = "tenants"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from tenants import (
            live,  # noqa: F401  (signing out closes that session's live sockets)
            schema,  # noqa: F401  (registers the OpenAPI auth scheme)
        )
        from tenants.scoping import install_row_level_security

        # After every migrate (tests included): each tenant table gets its RLS policy.
        post_migrate.connect(install_row_level_security, dispatch_uid="tenants.install_rls")
