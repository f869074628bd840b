"""Invitations: a signed, expiring token in a URL. Nothing is stored until it is accepted.

The token names the tenant, the email, the role and who invited; it is signed with SECRET_KEY
under its own salt and refused after INVITATION_MAX_AGE. At acceptance the inviter must still be
allowed to manage members (and to grant the role), so removing an admin voids their invitations.
"""

from __future__ import annotations

import logging
import secrets
from dataclasses import dataclass
from datetime import timedelta
from smtplib import SMTPException
from typing import Any

from django.contrib.auth import get_user_model
from django.core import signing
from django.core.mail import send_mail

from core.errors import DomainError
from core.scoping import tenant_context
from tenants.models import InvitationUse, Role, Tenant
from tenants.selectors import membership_for

logger = logging.getLogger(__name__)

SALT = "sagaplane.frontend.invitation"
INVITATION_MAX_AGE = timedelta(days=3)


class InvalidInvitation(DomainError):
    """An invitation link that cannot be accepted (expired, forged, voided or used): the page
    shows its `detail` (a kind of its own: the page catches it apart from the form's refusals)."""


@dataclass(frozen=True)
class Invitation:
    tenant: Tenant
    email: str
    role: str
    inviter: Any
    nonce: str


def may_grant(granter_role: str, role: str) -> bool:
    """Only an owner makes (or unmakes) owners; admins manage every other role."""
    return role != Role.OWNER or granter_role == Role.OWNER


def make_token(tenant: Tenant, email: str, role: str, inviter: Any) -> str:
    # The nonce makes each link single-use (tenants.InvitationUse records it on acceptance).
    nonce = secrets.token_hex(16)
    payload = {"t": tenant.pk, "e": email.strip().lower(), "r": role, "by": inviter.pk, "n": nonce}
    return signing.dumps(payload, salt=SALT)


def read_token(token: str) -> Invitation:
    try:
        data = signing.loads(token, salt=SALT, max_age=INVITATION_MAX_AGE)
    except signing.SignatureExpired:
        raise InvalidInvitation(
            "invitation_expired", "this invitation has expired; ask for a new one", status=410
        )
    except signing.BadSignature:
        raise InvalidInvitation("invitation_invalid", "this invitation link is not valid", status=410)
    tenant = Tenant.objects.filter(pk=data.get("t")).first()
    inviter = get_user_model().objects.filter(pk=data.get("by"), is_active=True).first()
    role = data.get("r")
    nonce = data.get("n")
    if tenant is None or inviter is None or role not in Role.values or not isinstance(nonce, str):
        raise InvalidInvitation("invitation_void", "this invitation is no longer valid", status=410)
    granter = membership_for(inviter, tenant.slug)
    if granter is None or not granter.can("manage_members") or not may_grant(granter.role, role):
        raise InvalidInvitation("invitation_void", "this invitation is no longer valid", status=410)
    with tenant_context(tenant):
        used = InvitationUse.objects.filter(nonce=nonce).exists()
    if used:
        raise InvalidInvitation("invitation_used", "this invitation has already been used", status=410)
    return Invitation(tenant=tenant, email=data["e"], role=role, inviter=inviter, nonce=nonce)


def send_invitation(tenant: Tenant, email: str, role: str, inviter: Any, url: str) -> bool:
    """E-mail the link (EMAIL_URL decides how; the console in development). The page shows the
    link too, so a failed send never loses an invitation: it says so and the link is copied by hand."""
    who = inviter.get_full_name() or inviter.email or inviter.get_username()
    body = (
        f"{who} invited you to {tenant.name} on Sagaplane as {role}.\n\n"
        f"Accept within {INVITATION_MAX_AGE.days} days: {url}\n\n"
        "If you did not expect this, ignore this message."
    )
    try:
        return send_mail(f"Join {tenant.name} on Sagaplane", body, None, [email]) == 1
    except (OSError, SMTPException):
        logger.warning("could not e-mail the invitation to %s", email, exc_info=True)
        return False
