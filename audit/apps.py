from django.apps import AppConfig


class AuditConfig(AppConfig):
    name = "audit"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from audit import services
        from core import actionaudit

        # Every app's state changes write their audit records through core.actionaudit.
        actionaudit.register(services.append_server_records)
