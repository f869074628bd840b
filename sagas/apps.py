from django.apps import AppConfig


class SagasConfig(AppConfig):
    name = "sagas"
    default_auto_field = "django.db.models.BigAutoField"
