"""Administration: members and roles (invite, change, remove) and API keys (create, revoke).

Every change goes through `tenants.services`, which records it in the tenant's audit stream."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django import forms
from django.contrib import messages
from django.contrib.auth import get_user_model, login, logout, password_validation
from django.core.exceptions import ValidationError
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods

from core.actors import Actor
from core.errors import DomainError
from core.scoping import tenant_context
from frontend import invitations
from frontend.views import MemberRequest, actor_of, member_page, page
from tenants import selectors, services
from tenants.access import MANAGE_KEYS, MANAGE_MEMBERS
from tenants.actors import invitation_actor
from tenants.models import ApiKey, Membership, Role, Scope
from tenants.permissions import SESSION_TENANT_KEY

EXPIRY_CHOICES = [("", "Never"), ("30", "30 days"), ("90", "90 days"), ("365", "1 year")]


class InviteForm(forms.Form):
    email = forms.EmailField(max_length=254)
    role = forms.ChoiceField(choices=Role.choices, initial=Role.VIEWER)


class ApiKeyForm(forms.Form):
    name = forms.CharField(max_length=100)
    scopes = forms.MultipleChoiceField(choices=Scope.choices, widget=forms.CheckboxSelectMultiple)
    expires_in_days = forms.ChoiceField(choices=EXPIRY_CHOICES, required=False)


class AcceptForm(forms.Form):
    password = forms.CharField(widget=forms.PasswordInput, strip=False)
    password_again = forms.CharField(widget=forms.PasswordInput, strip=False)

    def clean(self) -> dict[str, Any]:
        super().clean()
        data = self.cleaned_data
        if data.get("password") and data.get("password") != data.get("password_again"):
            raise ValidationError("the two passwords differ")
        if data.get("password"):
            password_validation.validate_password(data["password"])
        return data


# ---------------------------------------------------------------------------------------- members


def _members_page(
    request: MemberRequest, form: InviteForm | None = None, invite_url: str = "", **extra: Any
) -> HttpResponse:
    members = selectors.members()
    owner_count = sum(1 for m in members if m.role == Role.OWNER)
    is_owner = request.membership.role == Role.OWNER
    mine = request.membership.role
    grantable = [(value, label) for value, label in Role.choices if invitations.may_grant(mine, value)]
    rows = [
        {
            "m": m,
            "is_self": m.user_id == request.user.pk,
            "editable": (m.role != Role.OWNER or is_owner),
            "last_owner": m.role == Role.OWNER and owner_count == 1,
        }
        for m in members
    ]
    context = {
        "rows": rows,
        "form": form or InviteForm(),
        "grantable": grantable,
        "invite_url": invite_url,
        "invite_days": invitations.INVITATION_MAX_AGE.days,
        **extra,
    }
    response = page(request, "frontend/members.html", context, section="members")
    if invite_url:
        response["Cache-Control"] = "no-store"
    return response


@never_cache
@member_page({"GET": MANAGE_MEMBERS}, section="members")
def members(request: MemberRequest) -> HttpResponse:
    return _members_page(request)


@never_cache
@member_page({"POST": MANAGE_MEMBERS}, section="members")
def invite(request: MemberRequest) -> HttpResponse:
    form = InviteForm(request.POST)
    if form.is_valid():
        role = form.cleaned_data["role"]
        if not invitations.may_grant(request.membership.role, role):
            form.add_error("role", "only an owner can invite an owner")
        else:
            email = form.cleaned_data["email"]
            token = invitations.make_token(request.tenant, email, role, request.user)
            url = request.build_absolute_uri(reverse("invite-accept", args=[token]))
            sent = invitations.send_invitation(request.tenant, email, role, request.user, url)
            return _members_page(request, invite_url=url, invited_email=email, invite_sent=sent)
    return _members_page(request, form=form)


def _member_or_404(membership_id: int) -> Membership:
    # The tenant manager only sees the active tenant's rows: another tenant's id is a 404.
    membership = selectors.member(membership_id)
    if membership is None:
        raise Http404("no such member")
    return membership


@member_page({"POST": MANAGE_MEMBERS}, section="members")
def change_role(request: MemberRequest, membership_id: int) -> HttpResponse:
    target = _member_or_404(membership_id)
    role = request.POST.get("role", "")
    mine = request.membership.role
    if not invitations.may_grant(mine, role) or not invitations.may_grant(mine, target.role):
        messages.error(request, "Only an owner can make or unmake owners.")
        return redirect("members")
    try:
        services.change_member_role(target, role, actor=actor_of(request))
    except DomainError as exc:
        messages.error(request, f"Role not changed: {exc}.")
    else:
        messages.success(request, f"{target.user.email or target.user.username} is now {role}.")
    return redirect("members")


@member_page({"POST": MANAGE_MEMBERS}, section="members")
def remove(request: MemberRequest, membership_id: int) -> HttpResponse:
    target = _member_or_404(membership_id)
    if not invitations.may_grant(request.membership.role, target.role):
        messages.error(request, "Only an owner can remove an owner.")
        return redirect("members")
    try:
        services.remove_member(target, actor=actor_of(request))
    except DomainError as exc:
        messages.error(request, f"Not removed: {exc}.")
        return redirect("members")
    messages.success(request, f"{target.user.email or target.user.username} was removed.")
    if target.user_id == request.user.pk:
        request.session.pop(SESSION_TENANT_KEY, None)
        return redirect("home")
    return redirect("members")


# --------------------------------------------------------------------------------------- API keys


def _keys_page(
    request: MemberRequest, form: ApiKeyForm | None = None, new_key: str = "", created: ApiKey | None = None
) -> HttpResponse:
    keys = selectors.api_keys()
    now = timezone.now()
    rows = []
    for key in keys:
        expired = key.expires_at is not None and key.expires_at <= now
        status = "revoked" if key.revoked_at else ("expired" if expired else "active")
        rows.append({"key": key, "status": status})
    context = {
        "rows": rows,
        "form": form or ApiKeyForm(initial={"scopes": [Scope.INGEST, Scope.GATE, Scope.READ]}),
        "scopes": Scope.choices,
        "new_key": new_key,
        "created": created,
        "expiry_choices": EXPIRY_CHOICES,
    }
    response = page(request, "frontend/keys.html", context, section="members")
    response["Cache-Control"] = "no-store"
    return response


@member_page({"GET": MANAGE_KEYS}, section="members")
def keys(request: MemberRequest) -> HttpResponse:
    return _keys_page(request)


@member_page({"POST": MANAGE_KEYS}, section="members")
def create_key(request: MemberRequest) -> HttpResponse:
    form = ApiKeyForm(request.POST)
    if not form.is_valid():
        return _keys_page(request, form=form)
    days = form.cleaned_data.get("expires_in_days")
    expires_at = timezone.now() + timedelta(days=int(days)) if days else None
    body = {
        "name": form.cleaned_data["name"],
        "scopes": list(form.cleaned_data["scopes"]),
        "expires_at": expires_at.isoformat() if expires_at else None,
    }
    try:
        new = services.ApiKeyCreate.parse(body)
        api_key, raw_key = services.create_api_key(
            request.tenant, new, created_by=request.user, actor=actor_of(request)
        )
    except DomainError as exc:
        form.add_error(None, str(exc))
        return _keys_page(request, form=form)
    # Rendered, not redirected: the raw key lives only in this one response.
    return _keys_page(request, new_key=raw_key, created=api_key)


@member_page({"POST": MANAGE_KEYS}, section="members")
def revoke_key(request: MemberRequest, key_id: int) -> HttpResponse:
    api_key = selectors.api_key(key_id)
    if api_key is None:
        raise Http404("no such key")
    services.revoke_api_key(api_key, actor=actor_of(request))
    messages.success(request, f"Key {api_key.name} (sp_{api_key.prefix}_…) is revoked.")
    return redirect("keys")


# ------------------------------------------------------------------------------ accepting invites


def _invited_by(invitation: invitations.Invitation) -> Actor:
    return invitation_actor(invitation.inviter.get_username())


def _accept(invitation: invitations.Invitation, password: str | None = None) -> Membership:
    """Accept `invitation` inside its tenant. The page enters the tenant itself (no member page's
    mixin can: the person is not a member yet), once, around the service, so a refusal leaves the
    scope and rolls back whatever the accept had begun."""
    with tenant_context(invitation.tenant):
        return services.accept_invitation(
            invitation.tenant,
            invitation.email,
            invitation.role,
            password,
            nonce=invitation.nonce,
            actor=_invited_by(invitation),
        )


def _invitation_refused(request: HttpRequest, exc: DomainError) -> HttpResponse:
    """The invitation cannot be accepted (used a moment ago by a parallel accept: 410; its
    e-mail's account created meanwhile: 409)."""
    return render(request, "frontend/invite.html", {"error": exc.detail}, status=exc.status)


@never_cache
@require_http_methods(["GET", "POST"])
def accept_invite(request: HttpRequest, token: str) -> HttpResponse:
    try:
        invitation = invitations.read_token(token)
    except invitations.InvalidInvitation as exc:
        return render(request, "frontend/invite.html", {"error": exc.detail}, status=exc.status)
    user_model = get_user_model()
    existing = user_model.objects.filter(email__iexact=invitation.email).first()
    signed_in_as = request.user if request.user.is_authenticated else None
    context: dict = {"invitation": invitation, "existing": existing, "signed_in_as": signed_in_as}

    if existing is not None:
        if signed_in_as is None or signed_in_as.pk != existing.pk:
            # Joining an existing account needs that account's password: sign in first.
            context["login_url"] = f"{reverse('login')}?next={request.path}"
            return render(request, "frontend/invite.html", context)
        if request.method == "POST":
            try:
                _accept(invitation)
            except DomainError as exc:
                return _invitation_refused(request, exc)
            request.session[SESSION_TENANT_KEY] = invitation.tenant.slug
            return redirect("home")
        return render(request, "frontend/invite.html", context)

    if signed_in_as is not None and request.method == "POST" and "sign_out" in request.POST:
        logout(request)
        return redirect(request.path)
    form = AcceptForm(request.POST or None)
    if request.method == "POST" and signed_in_as is None and form.is_valid():
        try:
            membership = _accept(invitation, form.cleaned_data["password"])
        except DomainError as exc:
            return _invitation_refused(request, exc)
        else:
            login(request, membership.user, backend="django.contrib.auth.backends.ModelBackend")
            request.session[SESSION_TENANT_KEY] = invitation.tenant.slug
            return redirect("home")
    context["form"] = form
    return render(request, "frontend/invite.html", context)
