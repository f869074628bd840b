from django.apps import AppConfig


class SagasConfig(AppConfig):
    name = "sagas"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The projection follows the record store through audit's hooks (audit imports no app
        # above it): folded in the ingest transaction, rebuilt after an erasure.
        from audit import hooks
        from sagas import services

        hooks.on_records_appended(services.project_appended)
        hooks.on_payload_erased(services.rebuild_after_erasure)
