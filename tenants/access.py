"""Who may call what: one declaration per route and method, checked in one place.

Every tenant route (API view or HTML page) declares, for each HTTP method it answers, one
`Access`: the API-key scope an agent needs and the capability a signed-in member's role needs
(`tenants.models.ROLE_CAPABILITIES`); `None` closes the route to keys, or to members. A method
with no declaration answers 405 to everyone, and an API view that defines a handler without
declaring it fails at import, so nothing is open by omission.

Routes pick one of the named rules below, so an API endpoint and the page that shows the same
thing cannot drift apart: both say `AUDIT`, and `AUDIT` means one thing. `decide` is the only
code that compares a principal with a rule; `tenants.permissions.TenantScopedViewMixin` (API)
and `frontend.views.member_page` (pages) both call it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tenants.models import ApiKey, Membership, Scope


@dataclass(frozen=True)
class Access:
    """What one method of one route requires of the caller."""

    key_scope: str | None
    """The API-key scope an agent needs; None: not open to API keys."""
    capability: str | None
    """What a member's role must allow; None: not open to signed-in members."""
    signed_by: str | None = None
    """A webhook: the sender named here signs each request's body, and that signature is the
    only credential the route accepts (verified by the route, before it reads anything else);
    keys and sessions prove nothing to it. None: not a webhook."""


AccessMap = Mapping[str, Access]
"""HTTP method (upper case) → its rule. HEAD follows GET; anything undeclared answers 405."""

# ------------------------------------------------------------------------------ the named rules

READ = Access(key_scope=Scope.READ, capability="read")
"""Sagas, streams, the transparency log and its proofs: any member, or a key with `read`."""
INGEST = Access(key_scope=Scope.INGEST, capability=None)
"""Evidence comes from agents' keys, never from a browser session."""
AUDIT = Access(key_scope=Scope.AUDIT, capability="audit")
"""WORM exports (start, list, watch, download): every payload of the tenant in one file."""
WITNESSES_CHANGE = Access(key_scope=None, capability="manage_keys")
"""The log's witnesses and quorum (who vouches for it to auditors): owners and admins, never a key."""
ERASE = Access(key_scope=None, capability="audit")
"""Erasing a record's payload is a person's decision, never an agent's."""
MANAGE_MEMBERS = Access(key_scope=None, capability="manage_members")
"""The member list (every member's e-mail) and changes to it."""
MANAGE_KEYS = Access(key_scope=None, capability="manage_keys")
"""API keys: listing, creating, revoking."""
GATE = Access(key_scope=Scope.GATE, capability=None)
"""The pre-flight gate: agents ask it before an effect; people have nothing to ask."""
GATE_STATUS = Access(key_scope=Scope.GATE, capability="read")
"""Halts in force and governed tools: what an agent needs to act, and any member may see."""
FLEET_VIEW = Access(key_scope=Scope.CONTROL, capability="read")
"""Budgets (with their usage), rate limits, halts: every member sees them; keys need `control`."""
FLEET_CONTROL = Access(key_scope=Scope.CONTROL, capability="fleet")
"""Creating and deleting budgets and rate limits: owners and admins, or a `control` key."""
FLEET_HALT = Access(key_scope=Scope.CONTROL, capability="halt")
"""Kill switches and quarantine: owners, admins and approvers (risk staff), or a `control` key."""
RECONCILE = Access(key_scope=Scope.RECOVERY, capability=None)
"""Claiming reconciliation checks and answering them: the SDK workers' observers (`recovery` keys)."""
RECONCILE_DECIDE = Access(key_scope=Scope.CONTROL, capability="halt")
"""Re-opening a reconciliation verdict (after a fix): risk staff, or a `control` key."""
APPROVAL_POLICIES_VIEW = Access(key_scope=Scope.CONTROL, capability="read")
"""Approval policies: every member sees who must approve what; keys need `control`."""
APPROVAL_POLICIES_CHANGE = Access(key_scope=Scope.CONTROL, capability="fleet")
"""Creating, editing and deleting approval policies: owners and admins, or a `control` key."""
APPROVAL_WAIT = Access(key_scope=Scope.GATE, capability="read")
"""Waiting on one approval request: the agent that asked the gate, or any member."""
APPROVAL_VOTE = Access(key_scope=None, capability="approve")
"""Voting (and asking for a passkey challenge to vote with): people only, never an agent's key."""
SLACK_WEBHOOK = Access(key_scope=None, capability=None, signed_by="slack")
"""Slack's requests (/slack/...): authenticated by `X-Slack-Signature` over the raw body, within
five minutes, once (slackapp.services.verify_request); the Slack user's link to a member then
decides what they may do, by the same rules as here."""
INTEGRATIONS = Access(key_scope=None, capability="integrate")
"""Connecting the tenant to another service (installing Slack, its channel, e-mail matching):
owners only, never a key: it decides where requests go and who may answer them."""
LINK_IDENTITY = Access(key_scope=None, capability="read")
"""A member links their own chat identity (Slack user) to themselves: any member, never a key."""

OWN_PASSKEYS = Access(key_scope=None, capability="read")
"""A person's own passkeys (list, register, rename, revoke): every member, for themselves; no key."""
RECOVER = Access(key_scope=Scope.RECOVERY, capability=None)
"""Claiming recovery jobs and reporting their results: SDK recovery workers' keys only."""
RECOVERY_VIEW = Access(key_scope=Scope.RECOVERY, capability="read")
"""Recovery jobs and the human queue: every member, or a `recovery` key."""
RECOVERY_DECIDE = Access(key_scope=Scope.CONTROL, capability="halt")
"""The human queue's decisions (retry, resolve) and "rollback to here": risk staff, or `control`."""
RECOVERY_SETUP = Access(key_scope=Scope.CONTROL, capability="fleet")
"""The recovery webhook (its URL and signing secret): owners and admins, or a `control` key."""


@dataclass(frozen=True)
class Refusal:
    """Why a request is refused: HTTP status, machine-readable code and a sentence."""

    status: int
    code: str
    detail: str


def rule_for(access: AccessMap, method: str) -> Access | None:
    """The declared rule for `method`, or None (the route does not answer it: 405)."""
    method = method.upper()
    return access.get("GET" if method == "HEAD" else method)


def allowed_methods(access: AccessMap) -> list[str]:
    """The methods a route answers, for the `Allow` header of a 405."""
    methods = sorted(access)
    return [*methods, "HEAD"] if "GET" in access else methods


def decide(
    rule: Access, *, api_key: ApiKey | None = None, membership: Membership | None = None
) -> Refusal | None:
    """None when the key (or the member) may use the route under `rule`, else the refusal.
    Exactly one of `api_key` and `membership` is given: the caller has authenticated them.
    A webhook's rule (`signed_by`) admits neither: only its sender's signature."""
    if rule.signed_by is not None:
        return Refusal(
            401, "signature_required", f"this route accepts only requests signed by {rule.signed_by}"
        )
    if api_key is not None:
        if rule.key_scope is None:
            return Refusal(403, "missing_scope", "this route is not open to API keys")
        if not api_key.has_scope(rule.key_scope):
            return Refusal(403, "missing_scope", f"this API key lacks the '{rule.key_scope}' scope")
        return None
    if membership is None:
        raise ValueError("decide() needs the API key or the membership of the caller")
    if rule.capability is None:
        return Refusal(403, "role_forbidden", "this route is open to API keys only, not to members")
    if not membership.can(rule.capability):
        return Refusal(403, "role_forbidden", f"the role '{membership.role}' may not {rule.capability}")
    return None
