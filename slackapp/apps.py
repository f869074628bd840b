from django.apps import AppConfig


class SlackappConfig(AppConfig):
    name = "slackapp"
    label = "slackapp"
    verbose_name = "Slack"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The cross-tenant question (which tenant a Slack workspace belongs to) must be declared
        # before `migrate` installs the functions (tenants/rls.py).
        from slackapp import selectors  # noqa: F401
