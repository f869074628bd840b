from django.apps import AppConfig
from django.db.models.signals import post_migrate


class TenantsConfig(AppConfig):
    name = "tenants"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from core import (
            live,  # noqa: F401  (signing out closes that session's live sockets)
            rls,
        )
        from tenants import (
            schema,  # noqa: F401  (registers the OpenAPI auth scheme)
            selectors,  # noqa: F401  (declares the key-lookup and membership cross-tenant functions)
        )

        # After every migrate (as the owner role; tests included): every tenant table gets its RLS
        # policy, the runtime role its grants, and the cross-tenant functions are (re)created.
        post_migrate.connect(rls.install, sender=self, dispatch_uid="tenants.install_rls")
