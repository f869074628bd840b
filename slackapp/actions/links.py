"""Account links: which member a Slack user of the tenant's workspace acts as, by an explicit
confirmation (a signed, expiring invitation) or, where the owner turned it on, by e-mail."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from django.core import signing
from django.db import transaction
from django.urls import reverse
from sagaplane.events import Event

from core.actionaudit import append_server_record
from core.actors import Actor
from core.scoping import require_tenant
from slackapp import crypto, selectors
from slackapp.actions.web import UNREACHABLE, SlackError, bot_token, public_url, web_client
from slackapp.models import SLACK_NAME_MAX, Installation, UserLink
from tenants.actors import system_actor
from tenants.models import Membership, Tenant

log = logging.getLogger(__name__)

LINK_TTL_S = 15 * 60

_LINK_SALT = "slackapp.link"


def link_token(tenant: Tenant, team_id: str, slack_user_id: str) -> str:
    """A signed, expiring invitation for this Slack user to link themselves to a member (sent to
    them alone, in an ephemeral message)."""
    return signing.dumps(
        {"t": tenant.pk, "team": team_id, "user": slack_user_id}, salt=_LINK_SALT, compress=True
    )


def read_link_token(token: str) -> tuple[int, str, str]:
    """(tenant id, team id, Slack user id) of a link token, or SlackError when forged or expired."""
    try:
        data = signing.loads(token, salt=_LINK_SALT, max_age=LINK_TTL_S)
    except signing.SignatureExpired:
        raise SlackError(
            "link_expired", "this link has expired: ask Slack for a new one", status=410
        ) from None
    except signing.BadSignature:
        raise SlackError("invalid_link", "this link is not one Sagaplane made", status=404) from None
    if (
        not isinstance(data, dict)
        or not isinstance(data.get("t"), int)
        or not isinstance(data.get("team"), str)
        or not isinstance(data.get("user"), str)
    ):
        raise SlackError("invalid_link", "this link is not one Sagaplane made", status=404)
    return data["t"], data["team"], data["user"]


def link_url(tenant: Tenant, team_id: str, slack_user_id: str) -> str:
    return public_url(reverse("slack-link", args=[link_token(tenant, team_id, slack_user_id)]))


def slack_name(slack_user: dict[str, Any]) -> str:
    """The name Slack shows for a user (users.info's `user`): display name, else real name, else
    handle; "" when it gives none."""
    profile = slack_user.get("profile") or {}
    for name in (
        profile.get("display_name"),
        profile.get("real_name"),
        slack_user.get("real_name"),
        slack_user.get("name"),
    ):
        if isinstance(name, str) and name.strip():
            return name.strip()[:SLACK_NAME_MAX]
    return ""


def ask_slack_name(row: Installation, slack_user_id: str) -> str:
    """The Slack user's name as the installation's workspace shows it, asked with its bot token;
    "" when Slack cannot be asked (the link is made all the same, shown by its id). It waits on
    Slack: outside any transaction, with the row read in the tenant before."""
    try:
        info = web_client(bot_token(row)).users_info(user=slack_user_id)
    except (*UNREACHABLE, crypto.TokenUnreadable):
        log.warning("slack: users.info failed for %s", slack_user_id, exc_info=True)
        return ""
    return slack_name(info.get("user") or {})


def link_user(
    tenant: Tenant,
    user: Any,
    *,
    team_id: str,
    slack_user_id: str,
    how: str,
    actor: Actor,
    name: str = "",
) -> UserLink:
    """Link a Slack user of the tenant's workspace to this member (replacing the member's earlier
    link; a Slack user already linked to someone else must be unlinked first). `name`: what Slack
    calls them (`ask_slack_name`), shown beside the id. Inside the tenant; a refusal leaves
    nothing changed (its own savepoint: the e-mail match carries on after one)."""
    require_tenant(tenant)
    with transaction.atomic():
        row = Installation.objects.first()
        if row is None or row.team_id != team_id:
            raise SlackError(
                "not_installed", "this Slack workspace is no longer connected to the tenant", status=409
            )
        if not Membership.objects.filter(user=user).exists():
            raise SlackError("not_a_member", "only a member of the tenant can be linked", status=404)
        taken = UserLink.objects.filter(team_id=team_id, slack_user_id=slack_user_id).first()
        if taken is not None and taken.user_id == user.pk:
            if name and taken.slack_name != name:
                taken.slack_name = name
                taken.save(update_fields=["slack_name"])
            return taken
        if taken is not None:
            raise SlackError("slack_user_taken", "this Slack user is linked to another member", status=409)
        previous = UserLink.objects.filter(user=user).first()
        old = None
        if previous is not None:
            old = {"team_id": previous.team_id, "slack_user_id": previous.slack_user_id}
            previous.delete()
        link = UserLink.objects.create(
            team_id=team_id, slack_user_id=slack_user_id, slack_name=name[:SLACK_NAME_MAX], user=user, how=how
        )
        append_server_record(
            tenant,
            Event.SLACK_USER_LINKED,
            {
                "member": user.get_username(),
                "old": old,
                "new": {
                    "team_id": team_id,
                    "slack_user_id": slack_user_id,
                    "name": link.slack_name,
                    "how": how,
                },
            },
            actor=actor,
        )
    return link


def unlink_user(tenant: Tenant, user: Any, *, actor: Actor) -> bool:
    require_tenant(tenant)
    with transaction.atomic():  # the link and its record, together
        link = UserLink.objects.filter(user=user).first()
        if link is None:
            return False
        old = {"team_id": link.team_id, "slack_user_id": link.slack_user_id, "how": link.how}
        link.delete()
        append_server_record(
            tenant,
            Event.SLACK_USER_UNLINKED,
            {"member": user.get_username(), "old": old, "new": None},
            actor=actor,
        )
    return True


@dataclass(frozen=True)
class EmailToMatch:
    """A Slack user with no link, in a workspace whose owner turned e-mail matching on: who they
    are is Slack's to say (`slack_user_of`, outside any transaction), then `match_by_email`."""

    installation: Installation


def member_for(tenant: Tenant, team_id: str, slack_user_id: str) -> Membership | EmailToMatch | None:
    """The membership a Slack user acts through in this tenant: their explicit link; else, where
    the owner turned e-mail matching on, EmailToMatch (Slack must be asked for their e-mail).
    None: unlinked. Inside the tenant."""
    require_tenant(tenant)
    row = Installation.objects.first()
    if row is None or row.team_id != team_id:
        return None
    user_id = selectors.linked_user_id(team_id, slack_user_id)
    if user_id is not None:
        return Membership.objects.select_related("user").filter(user_id=user_id).first()
    return EmailToMatch(row) if row.email_matching else None


def slack_user_of(match: EmailToMatch, slack_user_id: str) -> dict[str, Any] | None:
    """Slack's users.info `user` (asked with the bot's token: it waits on Slack, so the caller
    holds no transaction); None when Slack cannot be asked."""
    try:
        info = web_client(bot_token(match.installation)).users_info(user=slack_user_id)
    except (*UNREACHABLE, crypto.TokenUnreadable):
        log.warning("slack: users.info failed for %s", slack_user_id, exc_info=True)
        return None
    return info.get("user") or {}


def match_by_email(
    tenant: Tenant, team_id: str, slack_user_id: str, slack_user: dict[str, Any]
) -> Membership | None:
    """The member whose e-mail Slack reports for this user (`slack_user_of`), then recorded as
    their link; None when none matches or the member is linked to someone else already. Inside
    the tenant."""
    require_tenant(tenant)
    profile = slack_user.get("profile") or {}
    email = profile.get("email")
    # Slack reports an e-mail only once the workspace has confirmed it; bots and guests never match.
    if (
        not isinstance(email, str)
        or "@" not in email
        or slack_user.get("is_bot")
        or slack_user.get("is_restricted")
    ):
        return None
    membership = (
        Membership.objects.select_related("user").filter(user__email__iexact=email).order_by("pk").first()
    )
    if membership is None:
        return None
    try:
        link_user(
            tenant,
            membership.user,
            team_id=team_id,
            slack_user_id=slack_user_id,
            how="email",
            actor=system_actor(f"slack-email-match:{slack_user_id}"),
            name=slack_name(slack_user),
        )
    except SlackError:
        return None  # the member is linked to someone else already: the explicit link wins
    return membership
