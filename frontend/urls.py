from django.contrib.auth import views as auth_views
from django.urls import path

from frontend import admin_views, evidence_views, fleet_views, passkey_views, saga_views, slack_views, views

urlpatterns = [
    path("", views.home, name="home"),
    # Django's form views also take PUT as POST; the sign-in page answers GET and POST only.
    path(
        "login/",
        auth_views.LoginView.as_view(
            template_name="frontend/login.html", http_method_names=["get", "head", "post"]
        ),
        name="login",
    ),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("login/passkey/options", passkey_views.sign_in_options, name="passkey-sign-in-options"),
    path("login/passkey", passkey_views.sign_in, name="passkey-sign-in"),
    path("tenant/switch", views.switch_tenant, name="switch-tenant"),
    path("invite/<str:token>", admin_views.accept_invite, name="invite-accept"),
    path("sagas/", saga_views.saga_list, name="sagas"),
    path("sagas/rows", saga_views.saga_rows, name="saga-rows"),
    path("sagas/<str:saga_id>/", saga_views.saga_detail, name="saga-detail"),
    path("sagas/<str:saga_id>/timeline", saga_views.saga_timeline, name="saga-timeline"),
    path("fleet/", fleet_views.fleet, name="fleet"),
    path("fleet/controls", fleet_views.fleet_controls, name="fleet-controls"),
    path("fleet/budgets", fleet_views.budget_create, name="fleet-budget-create"),
    path("fleet/budgets/<int:budget_id>/delete", fleet_views.budget_delete, name="fleet-budget-delete"),
    path("fleet/rate-limits", fleet_views.rate_limit_create, name="fleet-rate-limit-create"),
    path(
        "fleet/rate-limits/<int:rate_limit_id>/delete",
        fleet_views.rate_limit_delete,
        name="fleet-rate-limit-delete",
    ),
    path("fleet/halts", fleet_views.halt_create, name="fleet-halt-create"),
    path("fleet/halts/<int:halt_id>/resume", fleet_views.halt_resume, name="fleet-halt-resume"),
    path("evidence/", evidence_views.evidence, name="evidence"),
    path("evidence/exports", evidence_views.start_export, name="export-start"),
    path("evidence/exports/<uuid:export_id>", evidence_views.export_status, name="export-status"),
    path("administration/members/", admin_views.members, name="members"),
    path("administration/members/invite", admin_views.invite, name="member-invite"),
    path("administration/members/<int:membership_id>/role", admin_views.change_role, name="member-role"),
    path("administration/members/<int:membership_id>/remove", admin_views.remove, name="member-remove"),
    path("account/passkeys/", passkey_views.passkey_list, name="passkeys"),
    path("account/passkeys/options", passkey_views.registration_options, name="passkey-options"),
    path("account/passkeys/register", passkey_views.register, name="passkey-register"),
    path("account/passkeys/rename", passkey_views.rename, name="passkey-rename"),
    path("account/passkeys/revoke", passkey_views.revoke, name="passkey-revoke"),
    path("administration/keys/", admin_views.keys, name="keys"),
    path("administration/keys/create", admin_views.create_key, name="key-create"),
    path("administration/keys/<int:key_id>/revoke", admin_views.revoke_key, name="key-revoke"),
    path("integrations/slack/", slack_views.settings_page, name="slack-settings"),
    path("integrations/slack/install", slack_views.install, name="slack-install"),
    path("integrations/slack/oauth/callback", slack_views.oauth_callback, name="slack-oauth-callback"),
    path("integrations/slack/channel", slack_views.channel, name="slack-channel"),
    path("integrations/slack/email-matching", slack_views.email_matching, name="slack-email-matching"),
    path("integrations/slack/uninstall", slack_views.uninstall, name="slack-uninstall"),
    path("integrations/slack/link/<str:token>", slack_views.link, name="slack-link"),
    path("integrations/slack/unlink", slack_views.unlink, name="slack-unlink"),
]
