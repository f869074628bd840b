"""The Slack pages: install (OAuth v2) and its settings for owners, and the account-link page on
which a member confirms that a Slack user is them.

Everything goes through `slackapp.services` (actor `user:<name>`), which records it in the
tenant's server stream. The install's OAuth `state` is issued to the signed-in owner in the
tenant they act for, and consumed once by the callback; a refusal is shown on the settings page
and changes nothing else.

"Add to Slack" is a link to Slack's consent page, with a state issued when the settings page is
rendered (as Slack's own button is), not a form: a form that posts here and is redirected to
Slack is a form submission to another origin, which the pages' CSP (`form-action 'self'`) blocks
in every browser that enforces it, redirects included (Slack's consent flow may move on to a
workspace's own subdomain, so allowing "the consent origin" would not be enough either). The link
needs no CSRF token: the state is the binding. Nobody but this owner's page learns it, and the
callback accepts it only from the same owner in the same tenant, once, within ten minutes.

The pages that ask Slack (the channel list, the install's code exchange, the channel choice,
uninstall, the link page's name) are entered with `transaction=False`: each reads in the tenant,
asks Slack with no transaction open, then writes in the tenant, so a slow Slack holds no lock and
no transaction (docs/ARCHITECTURE.md §1).
"""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpResponse
from django.shortcuts import redirect
from django.urls import reverse

from core.scoping import tenant_context
from frontend.views import MemberRequest, actor_of, member_page, page
from slackapp import selectors, services
from slackapp.services import SlackError
from tenants.access import INTEGRATIONS, LINK_IDENTITY


def _back(request: MemberRequest, error: SlackError | None = None, done: str = "") -> HttpResponse:
    if error is not None:
        messages.error(request, error.detail)
    elif done:
        messages.success(request, done)
    return redirect("slack-settings")


@member_page({"GET": INTEGRATIONS}, section="slack-settings", transaction=False)
def settings_page(request: MemberRequest) -> HttpResponse:
    with tenant_context(request.tenant):
        row = selectors.installation()
        links = []
        if row is not None:
            links = [
                {"link": link, "member": email or "(no longer a member)"} for link, email in selectors.links()
            ]
        consent_url = ""
        if row is None and services.configured():
            consent_url = services.start_install(request.tenant, request.user)
    channels: list[dict[str, str]] = []
    channel_error = ""
    if row is not None:
        try:
            channels = services.list_channels(row)
        except SlackError as exc:
            channel_error = exc.detail
    return page(
        request,
        "frontend/slack.html",
        {
            "configured": services.configured(),
            "installation": row,
            "channels": channels,
            "channel_error": channel_error,
            "links": links,
            "consent_url": consent_url,
        },
        section="slack-settings",
    )


@member_page({"GET": INTEGRATIONS}, section="slack-settings", transaction=False)
def oauth_callback(request: MemberRequest) -> HttpResponse:
    code, state = request.GET.get("code", ""), request.GET.get("state", "")
    if request.GET.get("error"):
        # The person clicked Cancel on Slack's page; the state is spent all the same.
        with tenant_context(request.tenant):
            services.StateStore(request.tenant, request.user).consume(state)
        return _back(request, SlackError("cancelled", "Slack install cancelled."))
    try:
        with tenant_context(request.tenant):  # the state spent, committed before Slack is asked
            services.claim_install(request.tenant, request.user, code=code, state=state)
        installation = services.exchange_code(code)
        with tenant_context(request.tenant):
            row = services.save_install(request.tenant, installation, actor=actor_of(request))
    except SlackError as exc:
        return _back(request, exc)
    return _back(
        request, done=f"Slack installed in {row.team_name or row.team_id}. Choose the channel for requests."
    )


@member_page({"POST": INTEGRATIONS}, section="slack-settings", transaction=False)
def channel(request: MemberRequest) -> HttpResponse:
    with tenant_context(request.tenant):
        listed = selectors.installation()
    try:
        channels = services.list_channels(listed) if listed is not None else []
        with tenant_context(request.tenant):
            row = services.set_channel(
                request.tenant,
                request.POST.get("channel", ""),
                channels,
                team_id=listed.team_id if listed is not None else "",
                actor=actor_of(request),
            )
    except SlackError as exc:
        return _back(request, exc)
    return _back(request, done=f"Approval requests go to #{row.channel_name}.")


@member_page({"POST": INTEGRATIONS}, section="slack-settings")
def email_matching(request: MemberRequest) -> HttpResponse:
    enabled = request.POST.get("enabled") == "on"
    try:
        services.set_email_matching(request.tenant, enabled, actor=actor_of(request))
    except SlackError as exc:
        return _back(request, exc)
    return _back(request, done="E-mail matching is " + ("on." if enabled else "off."))


@member_page({"POST": INTEGRATIONS}, section="slack-settings", transaction=False)
def uninstall(request: MemberRequest) -> HttpResponse:
    with tenant_context(request.tenant):
        row = selectors.installation()
    if row is None:
        return _back(request, SlackError("not_installed", "Slack was not installed.", status=404))
    services.revoke_app(row)
    with tenant_context(request.tenant):  # gone meanwhile (Slack's own event): uninstalled all the same
        services.uninstall(request.tenant, row.team_id, actor=actor_of(request))
    return _back(request, done="Slack uninstalled: its token and every account link are deleted.")


@member_page({"GET": LINK_IDENTITY, "POST": LINK_IDENTITY}, transaction=False)
def link(request: MemberRequest, token: str) -> HttpResponse:
    """A Slack user's invitation to act as the signed-in member: shown with who they are in Slack
    and what linking lets them do, confirmed by a POST (never by opening the link)."""
    try:
        tenant_id, team_id, slack_user_id = services.read_link_token(token)
    except SlackError as exc:
        return page(request, "frontend/slack_link.html", {"error": exc.detail}, status=exc.status)
    if tenant_id != request.tenant.pk:
        error = "This link is for another tenant: switch to it (top right), then open the link again."
        return page(request, "frontend/slack_link.html", {"error": error}, status=404)
    with tenant_context(request.tenant):
        row = selectors.installation()
    if row is None or row.team_id != team_id:
        error = "This Slack workspace is no longer connected to the tenant."
        return page(request, "frontend/slack_link.html", {"error": error}, status=409)
    name = services.ask_slack_name(row, slack_user_id)
    context = {
        "team": row.team_name or team_id,
        "slack_user_id": slack_user_id,
        "slack_name": name,
        "token": token,
    }
    if request.method == "POST":
        try:
            with tenant_context(request.tenant):  # link_user checks the workspace again, locked
                services.link_user(
                    request.tenant,
                    request.user,
                    team_id=team_id,
                    slack_user_id=slack_user_id,
                    how="confirmed",
                    actor=actor_of(request),
                    name=name,
                )
        except SlackError as exc:
            return page(
                request, "frontend/slack_link.html", {**context, "error": exc.detail}, status=exc.status
            )
        return page(request, "frontend/slack_link.html", {**context, "linked": True})
    with tenant_context(request.tenant):
        current = selectors.link_of(request.user.pk)
    return page(request, "frontend/slack_link.html", {**context, "current": current})


@member_page({"POST": LINK_IDENTITY})
def unlink(request: MemberRequest) -> HttpResponse:
    if services.unlink_user(request.tenant, request.user, actor=actor_of(request)):
        messages.success(request, "Your Slack account is unlinked.")
    return redirect(reverse("home"))
