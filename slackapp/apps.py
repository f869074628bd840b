from django.apps import AppConfig


class SlackappConfig(AppConfig):
    name = "slackapp"
    label = "slackapp"
    verbose_name = "Slack"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The cross-tenant question (which tenant a Slack workspace belongs to) must be declared
        # before `migrate` installs the functions (core/rls.py); the approvals hooks post and
        # update the channel's messages.
        from slackapp import hooks, selectors  # noqa: F401

        hooks.subscribe()
