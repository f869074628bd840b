from django.apps import AppConfig


class PasskeysConfig(AppConfig):
    name = "passkeys"
    default_auto_field = "django.db.models.BigAutoField"
