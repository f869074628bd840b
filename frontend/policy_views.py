"""Approval policies in the dashboard: the list, the rule builder (create and Edit), a policy's
version history with what each version changed, and the "would match" preview.

The builder's rows (`frontend.policy_builder`) become the API's body here, and the API's own input
(`approvals.services.PolicyCreate` / `PolicyChange`) checks it: a refusal is shown beside the form
as typed, and nothing changes. Deadlines are asked and shown in minutes. An Edit is
`approvals.services.update_policy`: the policy's next version (requests opened under the old one
are never reused); every version is kept with who made it and when (`PolicyVersion`).

The preview runs the terms as the form has them against the tenant's step calls of the last 24
hours (`approvals.selectors.would_match`, bounded): how many would have needed approval, and a few.

Rules: every member sees the list and the history (APPROVAL_POLICIES_VIEW); owners and admins
create, edit, preview, enable, disable and delete (APPROVAL_POLICIES_CHANGE).
"""

from __future__ import annotations

import json
from typing import Any

from django.contrib import messages
from django.http import Http404, HttpResponse
from django.shortcuts import redirect
from django.urls import reverse

from approvals import selectors
from approvals import services as approvals
from approvals.models import ApprovalPolicy
from core.errors import DomainError
from core.numbers import ascii_int
from frontend import policy_builder as builder
from frontend.views import MemberRequest, actor_of, member_page, page
from tenants import selectors as tenants
from tenants.access import APPROVAL_POLICIES_CHANGE, APPROVAL_POLICIES_VIEW, decide
from tenants.models import Role

SEMANTICS_CHOICES = ["IRREVERSIBLE", "COMPENSABLE", "REVERSIBLE", "PREVIEW"]
ROLE_CHOICES = [Role.APPROVER.value, Role.ADMIN.value, Role.OWNER.value]
MINUTES_MAX_CHARS = 8
# The terms a version shows, in order, with how they read.
TERM_LABELS = [
    ("name", "Name"),
    ("tool", "Tools"),
    ("semantics", "Semantics"),
    ("predicates", "When"),
    ("required_approvals", "Approvals required"),
    ("eligible_roles", "Who may approve"),
    ("eligible_members", "Named members"),
    ("passkey_only", "Passkey votes only"),
    ("ttl_s", "Time to decide"),
    ("execution_window_s", "Time to start after approval"),
    ("warn_before_s", "Warn approvers before expiry"),
    ("escalation", "Escalation"),
    ("enabled", "Status"),
]


def _emails() -> dict[int, str]:
    return {m.user_id: m.user.email for m in tenants.members()}


# ------------------------------------------------------------------------------------- reading


def term_text(name: str, value: Any, emails: dict[int, str]) -> str:
    """One term of a policy as people read it (never JSON)."""
    if name == "predicates":
        return builder.sentence(value) or "every call"
    if name in ("ttl_s", "execution_window_s", "warn_before_s"):
        return builder.minutes_text(int(value))
    if name == "semantics":
        return ", ".join(value) or "any"
    if name == "eligible_roles":
        return ", ".join(value) or "none"
    if name == "eligible_members":
        return ", ".join(emails.get(m, f"member {m}") for m in value) or "none"
    if name == "passkey_only":
        return "yes" if value else "no"
    if name == "enabled":
        return "enabled" if value else "disabled"
    if name == "escalation":
        levels = [
            f"after {builder.minutes_text(level['after_s'])}: "
            + ", ".join(
                list(level.get("roles", []))
                + [emails.get(m, f"member {m}") for m in level.get("members", [])]
            )
            for level in value
        ]
        return "; ".join(levels) or "none"
    return str(value)


def changes(old: dict[str, Any] | None, new: dict[str, Any], emails: dict[int, str]) -> list[dict[str, str]]:
    """What `new` changed from `old` (every term when it is the first version), as text."""
    out = []
    for name, label in TERM_LABELS:
        if name not in new or (old is not None and old.get(name) == new.get(name)):
            continue
        before = term_text(name, old[name], emails) if old is not None and name in old else ""
        out.append({"term": label, "old": before, "new": term_text(name, new[name], emails)})
    return out


def _listed(policy: ApprovalPolicy, emails: dict[int, str]) -> dict[str, Any]:
    values = approvals.policy_values(policy)
    return {
        **values,
        "id": policy.pk,
        "when": term_text("predicates", values["predicates"], emails),
        "ttl_text": builder.minutes_text(policy.ttl_s),
        "window_text": builder.minutes_text(policy.execution_window_s),
    }


# ------------------------------------------------------------------------------------- the form


def _minutes(form: Any, field: str, default: int) -> int:
    raw = str(form.get(field, "") or "").strip()
    if not raw:
        return default * 60
    minutes = ascii_int(raw, max_digits=MINUTES_MAX_CHARS)
    if minutes is None:
        raise DomainError("invalid", f"{field}: a whole number of minutes", field=field)
    return minutes * 60


def policy_body(form: Any, rows: builder.Builder) -> dict[str, Any]:
    """The form as the API's body: what is presentation only (minutes, checkboxes, a
    comma-separated list, the builder's rows) converted; the typed input checks the rest."""
    required = ascii_int(str(form.get("required_approvals", "1") or "1").strip(), max_digits=3)
    if required is None:
        raise DomainError("invalid", "required_approvals: a whole number", field="required_approvals")
    members = [m.strip() for m in str(form.get("eligible_members", "") or "").split(",") if m.strip()]
    ttl_s = _minutes(form, "ttl_minutes", 60)
    return {
        "name": str(form.get("name", "")).strip(),
        "tool": str(form.get("tool", "") or "*").strip(),
        "semantics": [s for s in form.getlist("semantics") if isinstance(s, str)],
        "predicates": builder.predicates_of(rows),
        "required_approvals": required,
        "eligible_roles": [r for r in form.getlist("eligible_roles") if isinstance(r, str)],
        "eligible_members": members,
        "passkey_only": form.get("passkey_only") == "on",
        "ttl_s": ttl_s,
        "execution_window_s": _minutes(form, "execution_window_minutes", 5),
        "warn_before_s": _minutes(form, "warn_before_minutes", 5),
        "escalation": builder.escalation_of(rows, ttl_s),
    }


def _typed(form: Any) -> dict[str, Any]:
    values: dict[str, Any] = {key: str(form.get(key, ""))[:5000] for key in form}
    values["semantics"] = form.getlist("semantics")
    values["eligible_roles"] = form.getlist("eligible_roles")
    return values


def _stored_values(policy: ApprovalPolicy, emails: dict[int, str]) -> dict[str, Any]:
    """A policy's terms as its Edit form's fields."""
    return {
        "name": policy.name,
        "tool": policy.tool,
        "semantics": list(policy.semantics),
        "required_approvals": str(policy.required_approvals),
        "eligible_roles": list(policy.eligible_roles),
        "eligible_members": ", ".join(emails.get(m, str(m)) for m in policy.eligible_members),
        "passkey_only": policy.passkey_only,
        "ttl_minutes": builder.minutes_text(policy.ttl_s).removesuffix(" min"),
        "execution_window_minutes": builder.minutes_text(policy.execution_window_s).removesuffix(" min"),
        "warn_before_minutes": builder.minutes_text(policy.warn_before_s).removesuffix(" min"),
    }


def _preview(body: dict[str, Any]) -> dict[str, Any]:
    """The would-match preview of the form's tool, semantics and predicates (checked first)."""
    terms = approvals.PolicyChange.parse(
        {"tool": body["tool"], "semantics": body["semantics"], "predicates": body["predicates"]}
    )
    result = selectors.would_match(
        terms.tool or "*", list(terms.semantics or ()), list(terms.predicates or [])
    )
    return {"result": result, "sentence": builder.sentence(list(terms.predicates or [])) or "every call"}


def _form_context(
    request: MemberRequest,
    *,
    values: dict[str, Any],
    rows: builder.Builder,
    error: Any = None,
    preview: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "values": values,
        "rows": rows,
        "error": error,
        "preview": preview,
        "operators": builder.OPERATORS,
        "common_arguments": builder.COMMON_ARGUMENTS,
        "kept_sentence": builder.sentence(rows.kept) if rows.kept else "",
        "kept_json": json.dumps(rows.kept, indent=2) if rows.kept else "",
        "group_modes": builder.GROUP_MODES,
        "semantics_choices": SEMANTICS_CHOICES,
        "role_choices": ROLE_CHOICES,
        "may_change": decide(APPROVAL_POLICIES_CHANGE, membership=request.membership) is None,
    }


def _policies_page(request: MemberRequest, form: dict[str, Any], status: int = 200) -> HttpResponse:
    emails = _emails()
    rows = [_listed(p, emails) for p in selectors.policies()]
    return page(
        request,
        "frontend/approval_policies.html",
        {"policies": rows, **form},
        section="approvals",
        status=status,
    )


def _fresh_form(request: MemberRequest) -> dict[str, Any]:
    return _form_context(
        request,
        values={"eligible_roles": ROLE_CHOICES, "required_approvals": "1"},
        rows=builder.shown(builder.Builder()),
    )


def _submitted(
    request: MemberRequest, policy: ApprovalPolicy | None = None
) -> tuple[str, builder.Builder, dict[str, Any]]:
    """The builder's action (add or remove a row, preview, or "" to save), its rows and the form.
    An Edit keeps the policy's predicates that rows cannot show (`Builder.kept`)."""
    action = str(request.POST.get("builder", "") or "")[:40]
    rows = builder.posted(request.POST)
    if policy is not None:
        rows.kept = builder.stored(list(policy.predicates), [], {}).kept
    return action, rows, _typed(request.POST)


def _built(request: MemberRequest, render: Any, policy: ApprovalPolicy | None = None) -> HttpResponse | None:
    """A builder action answered (the form again, with its rows or its preview), or None: save."""
    action, rows, values = _submitted(request, policy)
    if action == "preview":
        try:
            preview = _preview(policy_body(request.POST, rows))
        except DomainError as exc:
            return render(_form_context(request, values=values, rows=builder.shown(rows), error=exc), 400)
        return render(_form_context(request, values=values, rows=builder.shown(rows), preview=preview), 200)
    if action:
        return render(_form_context(request, values=values, rows=builder.shown(rows, action)), 200)
    return None


# ------------------------------------------------------------------------------------- the pages


@member_page({"GET": APPROVAL_POLICIES_VIEW}, section="approvals")
def policies(request: MemberRequest) -> HttpResponse:
    return _policies_page(request, _fresh_form(request))


@member_page({"POST": APPROVAL_POLICIES_CHANGE}, section="approvals")
def policy_create(request: MemberRequest) -> HttpResponse:
    def render(form: dict[str, Any], status: int) -> HttpResponse:
        return _policies_page(request, form, status)

    answered = _built(request, render)
    if answered is not None:
        return answered
    _, rows, values = _submitted(request)
    try:
        terms = approvals.PolicyCreate.parse(policy_body(request.POST, rows))
        policy = approvals.create_policy(request.tenant, terms, actor=actor_of(request))
    except DomainError as exc:
        return render(_form_context(request, values=values, rows=builder.shown(rows), error=exc), exc.status)
    messages.success(request, f"Approval policy '{policy.name}' created.")
    return redirect("approval-policies-page")


def _policy_or_404(policy_id: int) -> ApprovalPolicy:
    policy = selectors.policy(policy_id)
    if policy is None:
        raise Http404("no such approval policy")
    return policy


def _edit_page(
    request: MemberRequest, policy: ApprovalPolicy, form: dict[str, Any], status: int
) -> HttpResponse:
    return page(
        request,
        "frontend/approval_policy_edit.html",
        {"policy": policy, **form},
        section="approvals",
        status=status,
    )


@member_page({"GET": APPROVAL_POLICIES_CHANGE, "POST": APPROVAL_POLICIES_CHANGE}, section="approvals")
def policy_edit(request: MemberRequest, policy_id: int) -> HttpResponse:
    """The builder over a policy's terms; saving makes its next version."""
    policy = _policy_or_404(policy_id)

    def render(form: dict[str, Any], status: int) -> HttpResponse:
        return _edit_page(request, policy, form, status)

    if request.method != "POST":
        emails = _emails()
        rows = builder.stored(list(policy.predicates), list(policy.escalation), emails)
        return render(
            _form_context(request, values=_stored_values(policy, emails), rows=builder.shown(rows)), 200
        )
    answered = _built(request, render, policy)
    if answered is not None:
        return answered
    _, rows, values = _submitted(request, policy)
    try:
        terms = approvals.PolicyChange.parse(policy_body(request.POST, rows))
        changed = approvals.update_policy(request.tenant, policy.pk, terms, actor=actor_of(request))
    except DomainError as exc:
        if exc.status == 404:
            raise Http404("no such approval policy") from None
        return render(_form_context(request, values=values, rows=builder.shown(rows), error=exc), exc.status)
    messages.success(request, f"Approval policy '{changed.name}' saved as version {changed.version}.")
    return redirect("approval-policy-history", policy_id=changed.pk)


@member_page({"GET": APPROVAL_POLICIES_VIEW}, section="approvals")
def policy_history(request: MemberRequest, policy_id: int) -> HttpResponse:
    """Every kept version, newest first, each with who made it, when, and what it changed."""
    policy = _policy_or_404(policy_id)
    emails = _emails()
    versions = selectors.policy_versions(policy.pk)
    rows = []
    for n, version in enumerate(versions):
        older = versions[n + 1].terms if n + 1 < len(versions) else None
        rows.append(
            {"version": version, "changes": changes(older, version.terms, emails), "whole": older is None}
        )
    return page(
        request,
        "frontend/approval_policy_history.html",
        {
            "policy": _listed(policy, emails),
            "rows": rows,
            "untracked": policy.version - len(versions) if versions else policy.version,
            "may_change": decide(APPROVAL_POLICIES_CHANGE, membership=request.membership) is None,
        },
        section="approvals",
    )


@member_page({"POST": APPROVAL_POLICIES_CHANGE}, section="approvals")
def policy_toggle(request: MemberRequest, policy_id: int) -> HttpResponse:
    policy = _policy_or_404(policy_id)
    terms = approvals.PolicyTerms(enabled=not policy.enabled)
    approvals.update_policy(request.tenant, policy.pk, terms, actor=actor_of(request))
    messages.success(
        request, f"Approval policy '{policy.name}' {'disabled' if policy.enabled else 'enabled'}."
    )
    return redirect("approval-policies-page")


@member_page({"POST": APPROVAL_POLICIES_CHANGE}, section="approvals")
def policy_delete(request: MemberRequest, policy_id: int) -> HttpResponse:
    try:
        approvals.delete_policy(request.tenant, policy_id, actor=actor_of(request))
    except DomainError as exc:
        if exc.status == 404:
            raise Http404("no such approval policy") from None
        raise
    messages.success(request, "Approval policy deleted; requests it opened keep its terms.")
    return redirect(reverse("approval-policies-page"))
