"""Reads of the Slack context. One question crosses tenants: which tenant a Slack workspace is
installed for (a signed request names its team, not a tenant), answered on Postgres by a
SECURITY DEFINER function that returns that tenant's id and nothing else (core/rls.py)."""

from __future__ import annotations

import re

from core import rls, scoping
from slackapp.models import Installation, RequestMessage, UserLink
from tenants.models import Membership, Tenant

_TEAM_TENANT = rls.cross_tenant_function(
    "sagaplane_slack_team_tenant",
    arguments="wanted_team text",
    returns="TABLE (tenant_id bigint)",
    body=f"SELECT tenant_id FROM {Installation._meta.db_table} WHERE team_id = wanted_team",
)
SLACK_ID = re.compile(r"[A-Z0-9]{1,32}")


def tenant_of_team(team_id: str) -> Tenant | None:
    """The tenant this Slack workspace is installed for (None: not installed anywhere)."""
    if not isinstance(team_id, str) or not SLACK_ID.fullmatch(team_id):
        return None
    if rls.enforces_rls():
        tenant_ids = [tenant_id for (tenant_id,) in _TEAM_TENANT.rows(team_id)]
    else:
        with scoping.dangerously_bypass_orm_scope():
            tenant_ids = list(
                Installation.objects.filter(team_id=team_id).values_list("tenant_id", flat=True)
            )
    return Tenant.objects.filter(pk=tenant_ids[0]).first() if tenant_ids else None


# -- inside the active tenant ---------------------------------------------------------------------


def installation() -> Installation | None:
    """The active tenant's Slack installation, if any."""
    return Installation.objects.first()


def linked_user_id(team_id: str, slack_user_id: str) -> int | None:
    """The id of the person this Slack user acts as in the active tenant (None: not linked)."""
    return (
        UserLink.objects.filter(team_id=team_id, slack_user_id=slack_user_id)
        .values_list("user_id", flat=True)
        .first()
    )


def links() -> list[tuple[UserLink, str | None]]:
    """The active tenant's Slack links, oldest first, each with its member's e-mail (None: the
    person is no longer a member)."""
    emails = dict(Membership.objects.values_list("user_id", "user__email"))
    return [(link, emails.get(link.user_id)) for link in UserLink.objects.order_by("linked_at", "pk")]


def link_of(user_id: int) -> UserLink | None:
    """The Slack user linked to this person in the active tenant, if any."""
    return UserLink.objects.filter(user_id=user_id).first()


def message_of(request_id: str) -> RequestMessage | None:
    """The channel message of an approval request in the active tenant (None: never claimed)."""
    return RequestMessage.objects.filter(request_id=request_id).first()


def slack_ids_of(user_ids: list[int]) -> dict[int, str]:
    """The Slack user linked to each of these people in the active tenant (the unlinked left out)."""
    return dict(UserLink.objects.filter(user_id__in=user_ids).values_list("user_id", "slack_user_id"))
