"""The access table: every route × every principal × every method, against one table of answers.

Modelled on NetBox's generated `*_without_permission` tests. The URL resolver is walked (API,
agent-saga compatibility, HTML pages, probes, the schema, Django's admin); each route must have
an entry in EXPECTED, and each entry must still name a route, so a new route fails here until
someone decides who may call it. For tenant routes the entry lists the methods the route answers
and, per method, which key scopes and which member roles get through; everything else follows
from the kind of route (API: anonymous 401, refused 403; page: sent to sign in, refused 403).
Methods a route does not declare must answer 405.

Principals: API keys holding exactly one scope each, members of tenant "acme" with each role,
the owner of another tenant (acting in their own tenant, so acme's objects must be 404), and
anonymous. Path parameters are acme's real objects. Every request runs in a transaction rolled
back afterwards, so requests do not disturb each other; an allowed request must not answer 5xx,
and a refused one must not write to the database (its queries are captured and inspected).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from django.contrib import admin
from django.db import connection, transaction
from django.test import Client, override_settings
from django.test.utils import CaptureQueriesContext
from django.urls import URLPattern, URLResolver, get_resolver, reverse
from django.urls.resolvers import RoutePattern

from approvals import services as approvals
from core.scoping import tenant_context
from fleet import services as fleet
from fleet.gate import GateRequest
from frontend import invitations
from reconciliation import services as reconciliation
from slackapp import services as slack
from tenants import founding, services
from tenants.actors import named_actor
from tenants.inputs import NewApiKey
from tenants.models import Role, Tenant
from tests.recovery.sagas import escalated_job
from tests.support.chains import Writer, compensated_saga
from tests.support.factories import open_reservation, outstanding_lease
from tests.support.scoping import in_statements, in_tenant
from tests.support.transparency import settle
from transparency import proofs, witnesses
from transparency import services as transparency
from transparency.tasks import build_export_in

KEY_SCOPES = ("ingest", "read", "audit", "gate", "control", "recovery")
ROLES = ("viewer", "auditor", "approver", "admin", "owner")
PRINCIPALS = (*(f"key:{s}" for s in KEY_SCOPES), *(f"member:{r}" for r in ROLES), "outsider", "anonymous")
METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
# Undeclared methods are refused before anyone is looked at, so three kinds of caller suffice.
PROBES = ("anonymous", "member:owner", "key:read")

EVERY_ROLE = frozenset(ROLES)
AUDITORS = frozenset({"auditor", "admin", "owner"})
ADMINS = frozenset({"admin", "owner"})
NOBODY: frozenset[str] = frozenset()

# ------------------------------------------------------------------------------------ outcomes

OK = "ok"  # through the access check: any answer below 500 but 401/403/404/405 or a sign-in redirect
LOGIN = "login"  # 302 to the sign-in page
ADMIN_LOGIN = "admin-login"  # 302 to the admin's sign-in page
Outcome = str | int


@dataclass(frozen=True)
class Allowed:
    """Who gets through one method of a tenant route."""

    keys: frozenset[str] = NOBODY
    roles: frozenset[str] = NOBODY


@dataclass(frozen=True)
class Api:
    """A tenant API route: keys by scope, members (session) by role."""

    methods: dict[str, Allowed]


@dataclass(frozen=True)
class Page:
    """A tenant HTML page: members by role; keys and anonymous callers are sent to sign in."""

    methods: dict[str, frozenset[str]]


@dataclass(frozen=True)
class Public:
    """Not a tenant route: the same answer for every caller, per method."""

    methods: dict[str, Outcome]


@dataclass(frozen=True)
class Signed:
    """A webhook authenticated by its sender's signature over the body (Slack): keys and sessions
    prove nothing, so every caller here (none signs) gets 401 in the error shape, per method."""

    methods: frozenset[str]


@dataclass(frozen=True)
class SignedIn:
    """Any signed-in person (a member of some tenant); everyone else is sent to sign in."""

    methods: frozenset[str]


@dataclass(frozen=True)
class AdminSite:
    """Django's admin: nobody here is staff, so every page sends every caller to its sign-in
    (GET is enough to see it closed), except the sign-in page itself and sign-out."""

    methods: dict[str, Outcome] = field(default_factory=lambda: {"GET": ADMIN_LOGIN})
    by_name: dict[str, Outcome] = field(default_factory=lambda: {"login": 200, "logout": 302})


READ = Allowed(keys=frozenset({"read"}), roles=EVERY_ROLE)
AUDIT = Allowed(keys=frozenset({"audit"}), roles=AUDITORS)
CONTROL = frozenset({"control"})
FLEET_VIEW = Allowed(keys=CONTROL, roles=EVERY_ROLE)
FLEET_CHANGE = Allowed(keys=CONTROL, roles=ADMINS)
RISK_STAFF = frozenset({"approver", "admin", "owner"})
HALTERS = Allowed(keys=CONTROL, roles=RISK_STAFF)
RECOVER = Allowed(keys=frozenset({"recovery"}))

OWNERS = frozenset({"owner"})

EXPECTED: dict[str, Api | Page | Public | Signed | SignedIn | AdminSite] = {
    # probes and documentation
    "healthz": Public({"GET": 200}),
    "readyz": Public({"GET": 200}),
    "metrics": Public({"GET": 200}),
    "favicon.ico": Public({"GET": 301}),  # development: open; production: a token or 404
    "api/schema": Public({"GET": 200}),
    "api/docs": Public({"GET": 200}),
    "api/redoc": Public({"GET": 200}),
    # the tenant's own endpoints
    "api/v1/tenant": Api({"GET": READ}),
    "api/v1/keys": Api({"GET": Allowed(roles=ADMINS), "POST": Allowed(roles=ADMINS)}),
    "api/v1/keys/<id:pk>": Api({"GET": Allowed(roles=ADMINS), "DELETE": Allowed(roles=ADMINS)}),
    "api/v1/members": Api({"GET": Allowed(roles=ADMINS)}),  # every member's e-mail: no key reads it
    # the transparency log: readers
    "api/v1/audit/checkpoint": Api({"GET": READ}),
    "api/v1/audit/key": Api({"GET": READ}),
    "api/v1/audit/proofs/inclusion": Api({"GET": READ}),
    "api/v1/audit/proofs/consistency": Api({"GET": READ}),
    "api/v1/audit/proofs/bundle": Api({"GET": READ}),
    "api/v1/audit/tile/entries/<path:bundle>": Api({"GET": READ}),
    "api/v1/audit/tile/<id:level>/<path:tile>": Api({"GET": READ}),
    "api/v1/audit/sagas/<str:saga_id>/disclosure": Api({"GET": READ}),
    # WORM exports hold every payload of the tenant: the audit scope, the audit capability
    "api/v1/audit/exports": Api({"GET": AUDIT, "POST": AUDIT}),
    "api/v1/audit/exports/<uuid:export_id>": Api({"GET": AUDIT}),
    "api/v1/audit/exports/<uuid:export_id>/download": Api({"GET": AUDIT}),
    # witnesses: anyone who reads the log sees who cosigns it; owners and admins (people) change them
    "api/v1/audit/witnesses": Api({"GET": READ, "POST": Allowed(roles=ADMINS)}),
    "api/v1/audit/witnesses/quorum": Api({"PUT": Allowed(roles=ADMINS)}),
    "api/v1/audit/witnesses/checkpoints": Api({"GET": READ}),
    "api/v1/audit/witnesses/policy": Api({"GET": READ}),
    "api/v1/audit/witnesses/<id:witness_id>": Api({"DELETE": Allowed(roles=ADMINS)}),
    # evidence in, evidence out
    "api/v1/streams/<str:stream_id>/records": Api({"POST": Allowed(keys=frozenset({"ingest"}))}),
    "api/v1/streams/<str:stream_id>": Api({"GET": READ}),
    "api/v1/audit/redactions": Api({"POST": Allowed(roles=AUDITORS)}),  # people only
    "api/v1/sagas": Api({"GET": READ}),
    "api/v1/sagas/<str:saga_id>": Api({"GET": READ}),
    # fleet controls: the gate for agents, policies for `control` keys and the people who run them
    "api/v1/gate/evaluate": Api({"POST": Allowed(keys=frozenset({"gate"}))}),
    "api/v1/gate/leases": Api({"POST": Allowed(keys=frozenset({"gate"}))}),
    "api/v1/gate/leases/<uuid:lease_id>/return": Api({"POST": Allowed(keys=frozenset({"gate"}))}),
    "api/v1/gate/reservations/<uuid:reservation_id>/settle": Api({"POST": Allowed(keys=frozenset({"gate"}))}),
    "api/v1/fleet/status": Api({"GET": Allowed(keys=frozenset({"gate"}), roles=EVERY_ROLE)}),
    "api/v1/fleet/budgets": Api({"GET": FLEET_VIEW, "POST": FLEET_CHANGE}),
    "api/v1/fleet/budgets/<id:budget_id>": Api(
        {"GET": FLEET_VIEW, "PATCH": FLEET_CHANGE, "DELETE": FLEET_CHANGE}
    ),
    "api/v1/fleet/rate-limits": Api({"GET": FLEET_VIEW, "POST": FLEET_CHANGE}),
    "api/v1/fleet/rate-limits/<id:rate_limit_id>": Api({"PATCH": FLEET_CHANGE, "DELETE": FLEET_CHANGE}),
    "api/v1/fleet/breakers": Api({"GET": FLEET_VIEW, "POST": FLEET_CHANGE}),
    "api/v1/fleet/breakers/<id:breaker_id>": Api(
        {"GET": FLEET_VIEW, "PATCH": FLEET_CHANGE, "DELETE": FLEET_CHANGE}
    ),
    "api/v1/fleet/settings": Api({"GET": FLEET_VIEW, "PATCH": FLEET_CHANGE}),
    "api/v1/fleet/halts": Api({"GET": FLEET_VIEW, "POST": HALTERS}),
    "api/v1/fleet/halts/<id:halt_id>": Api({"DELETE": HALTERS}),
    "api/v1/sagas/<str:saga_id>/quarantine": Api({"POST": HALTERS}),
    # reconciliation: observers (recovery keys) claim and answer; readers see; auditors certify
    "api/v1/reconciliation/claim": Api({"POST": Allowed(keys=frozenset({"recovery"}))}),
    "api/v1/reconciliation/answers": Api({"POST": Allowed(keys=frozenset({"recovery"}))}),
    "api/v1/reconciliation/report": Api({"GET": READ}),
    "api/v1/reconciliation/checks/<str:check_id>/report": Api(
        {"POST": Allowed(keys=frozenset({"recovery"}))}
    ),
    "api/v1/reconciliation/checks/<str:check_id>/recheck": Api({"POST": HALTERS}),
    "api/v1/audit/certificate": Api({"GET": AUDIT}),
    # recovery: workers claim and report with `recovery` keys; risk staff decide; admins set the webhook
    "api/v1/recovery/claim": Api({"POST": RECOVER}),
    "api/v1/recovery/results": Api({"POST": RECOVER}),
    "api/v1/recovery/jobs": Api({"GET": Allowed(keys=frozenset({"recovery"}), roles=EVERY_ROLE)}),
    "api/v1/recovery/jobs/<str:job_id>/complete": Api({"POST": RECOVER}),
    "api/v1/recovery/jobs/<str:job_id>/fail": Api({"POST": RECOVER}),
    "api/v1/recovery/jobs/<str:job_id>/heartbeat": Api({"POST": RECOVER}),
    "api/v1/recovery/jobs/<str:job_id>/retry": Api({"POST": HALTERS}),
    "api/v1/recovery/jobs/<str:job_id>/resolve": Api({"POST": HALTERS}),
    "api/v1/recovery/jobs/<str:job_id>/assign": Api({"POST": HALTERS}),
    "api/v1/recovery/webhook": Api({"GET": FLEET_CHANGE, "PUT": FLEET_CHANGE, "DELETE": FLEET_CHANGE}),
    "api/v1/sagas/<str:saga_id>/rollback": Api({"POST": HALTERS}),
    # approvals: policies like the fleet's; the queue for readers; votes by people who may approve
    "api/v1/approvals": Api({"GET": READ}),
    "api/v1/approvals/policies": Api({"GET": FLEET_VIEW, "POST": FLEET_CHANGE}),
    "api/v1/approvals/policies/<id:policy_id>": Api(
        {"GET": FLEET_VIEW, "PATCH": FLEET_CHANGE, "DELETE": FLEET_CHANGE}
    ),
    "api/v1/approvals/break-glass": Api({"GET": READ}),
    "api/v1/approvals/<str:approval_id>": Api({"GET": READ}),
    "api/v1/approvals/<str:approval_id>/votes": Api({"POST": Allowed(roles=RISK_STAFF)}),
    "api/v1/approvals/<str:approval_id>/challenge": Api({"POST": Allowed(roles=RISK_STAFF)}),
    "api/v1/approvals/<str:approval_id>/wait": Api(
        {"GET": Allowed(keys=frozenset({"gate"}), roles=EVERY_ROLE)}
    ),
    # agent-saga's SagaCloudClient
    "v1/wal/ingest": Api({"POST": Allowed(keys=frozenset({"ingest"}))}),
    "v1/approvals": Api({"GET": READ}),
    "v1/fleet/budget": Api({"GET": READ}),
    "v1/audit/report": Api({"GET": READ}),
    # pages
    "": SignedIn(frozenset({"GET"})),
    "login/": Public({"GET": 200, "POST": 200}),  # an empty form: shown again with its errors
    "logout/": Public({"POST": 302}),  # signed out (or already), sent to the sign-in page
    "login/passkey/options": Public({"POST": 200}),  # a challenge for any browser
    "login/passkey": Public({"POST": 400}),  # no credential: refused in the error shape
    "tenant/switch": SignedIn(frozenset({"POST"})),
    "invite/<str:token>": Public({"GET": 200, "POST": 200}),
    "sagas/": Page({"GET": EVERY_ROLE}),
    "sagas/rows": Page({"GET": EVERY_ROLE}),
    "sagas/find": Page({"GET": EVERY_ROLE}),
    "sagas/<str:saga_id>/": Page({"GET": EVERY_ROLE}),
    "sagas/<str:saga_id>/timeline": Page({"GET": EVERY_ROLE}),
    "fleet/": Page({"GET": EVERY_ROLE}),
    "fleet/controls": Page({"GET": EVERY_ROLE}),
    "fleet/budgets": Page({"POST": ADMINS}),
    "fleet/budgets/<id:budget_id>/edit": Page({"GET": ADMINS, "POST": ADMINS}),
    "fleet/budgets/<id:budget_id>/delete": Page({"POST": ADMINS}),
    "fleet/rate-limits": Page({"POST": ADMINS}),
    "fleet/rate-limits/<id:rate_limit_id>/edit": Page({"GET": ADMINS, "POST": ADMINS}),
    "fleet/rate-limits/<id:rate_limit_id>/delete": Page({"POST": ADMINS}),
    "fleet/breakers": Page({"POST": ADMINS}),
    "fleet/breakers/<id:breaker_id>/delete": Page({"POST": ADMINS}),
    "fleet/settings": Page({"POST": ADMINS}),
    "fleet/halts": Page({"POST": RISK_STAFF}),
    "fleet/halts/history": Page({"GET": EVERY_ROLE}),
    "fleet/denials/": Page({"GET": EVERY_ROLE}),
    "fleet/halts/<id:halt_id>/resume": Page({"POST": RISK_STAFF}),
    "recovery/": Page({"GET": EVERY_ROLE}),
    "recovery/jobs/<str:job_id>/retry": Page({"POST": RISK_STAFF}),
    "recovery/jobs/<str:job_id>/resolve": Page({"POST": RISK_STAFF}),
    "recovery/jobs/<str:job_id>/assign": Page({"POST": RISK_STAFF}),
    "recovery/sagas/<str:saga_id>/quarantine": Page({"POST": RISK_STAFF}),
    "sagas/<str:saga_id>/rollback": Page({"POST": RISK_STAFF}),
    "reconciliation/": Page({"GET": EVERY_ROLE}),
    "reconciliation/checks/<str:check_id>/recheck": Page({"POST": RISK_STAFF}),
    "approvals/": Page({"GET": EVERY_ROLE}),  # the queue, live
    "approvals/rows": Page({"GET": EVERY_ROLE}),
    "approvals/history/": Page({"GET": EVERY_ROLE}),
    "approvals/pending-badge": Page({"GET": EVERY_ROLE}),
    "approvals/policies/": Page({"GET": EVERY_ROLE}),
    "approvals/policies/create": Page({"POST": ADMINS}),
    "approvals/policies/<id:policy_id>/edit": Page({"GET": ADMINS, "POST": ADMINS}),
    "approvals/policies/<id:policy_id>/history": Page({"GET": EVERY_ROLE}),
    "approvals/policies/<id:policy_id>/toggle": Page({"POST": ADMINS}),
    "approvals/policies/<id:policy_id>/delete": Page({"POST": ADMINS}),
    "approvals/<str:approval_id>/": Page({"GET": EVERY_ROLE}),
    "approvals/<str:approval_id>/state": Page({"GET": EVERY_ROLE}),
    "approvals/<str:approval_id>/challenge": Page({"POST": RISK_STAFF}),  # a passkey vote's challenge
    "approvals/<str:approval_id>/vote": Page({"POST": RISK_STAFF}),
    "evidence/": Page({"GET": AUDITORS}),
    "evidence/exports": Page({"POST": AUDITORS}),
    "evidence/exports/<uuid:export_id>": Page({"GET": AUDITORS}),
    "evidence/witnesses": Page({"POST": ADMINS}),
    "evidence/witnesses/quorum": Page({"POST": ADMINS}),
    "evidence/witnesses/<id:witness_id>/remove": Page({"POST": ADMINS}),
    "administration/members/": Page({"GET": ADMINS}),
    "administration/members/invite": Page({"POST": ADMINS}),
    "administration/members/<id:membership_id>/role": Page({"POST": ADMINS}),
    "administration/members/<id:membership_id>/remove": Page({"POST": ADMINS}),
    "account/passkeys/": Page({"GET": EVERY_ROLE}),  # a person's own passkeys
    "account/passkeys/options": Page({"POST": EVERY_ROLE}),
    "account/passkeys/register": Page({"POST": EVERY_ROLE}),
    "account/passkeys/rename": Page({"POST": EVERY_ROLE}),
    "account/passkeys/revoke": Page({"POST": EVERY_ROLE}),
    "administration/keys/": Page({"GET": ADMINS}),
    "administration/keys/create": Page({"POST": ADMINS}),
    "administration/keys/<id:key_id>/revoke": Page({"POST": ADMINS}),
    # Slack: its requests are signed by Slack; owners install it; any member links their Slack user
    "slack/interactions": Signed(frozenset({"POST"})),
    "slack/commands": Signed(frozenset({"POST"})),
    "slack/events": Signed(frozenset({"POST"})),
    "integrations/slack/": Page({"GET": OWNERS}),
    "integrations/slack/oauth/callback": Page({"GET": OWNERS}),
    "integrations/slack/channel": Page({"POST": OWNERS}),
    "integrations/slack/email-matching": Page({"POST": OWNERS}),
    "integrations/slack/uninstall": Page({"POST": OWNERS}),
    "integrations/slack/link/<str:token>": Page({"GET": EVERY_ROLE, "POST": EVERY_ROLE}),
    "integrations/slack/unlink": Page({"POST": EVERY_ROLE}),
    # Django's admin site (staff only), as one entry for every route under it
    "admin/": AdminSite(),
}

# ----------------------------------------------------------------------------- the URL resolver


@dataclass(frozen=True)
class Route:
    pattern: str  # the full route as written in the URLconfs ("api/v1/sagas/<str:saga_id>")
    entry: str  # its key in EXPECTED
    namespace: str | None
    name: str | None
    params: tuple[str, ...]
    regex: bool
    prefix: str
    view: Any


def _walk(patterns: list[Any], prefix: str = "", namespace: str | None = None) -> Iterator[Route]:
    for item in patterns:
        if isinstance(item, URLResolver):
            yield from _walk(item.url_patterns, prefix + str(item.pattern), item.namespace or namespace)
        elif isinstance(item, URLPattern):
            pattern = prefix + str(item.pattern)
            regex = not isinstance(item.pattern, RoutePattern)
            params = tuple(item.pattern.regex.groupindex) if regex else tuple(item.pattern.converters)
            entry = "admin/" if namespace == "admin" else pattern
            yield Route(pattern, entry, namespace, item.name, params, regex, prefix, item.callback)


ROUTES = list(_walk(get_resolver().url_patterns))

# --------------------------------------------------------------------------------- the tenants


@dataclass
class World:
    clients: dict[str, Client]
    values: dict[str, Any]
    by_route: dict[str, dict[str, Any]]  # where one parameter name means different objects

    def path(self, route: Route) -> str:
        if route.regex and route.name is None:  # Django admin's catch-all
            return f"/{route.prefix}no-such-page/"
        values = {**self.values, **self.by_route.get(route.pattern, {})}
        missing = [p for p in route.params if p not in values]
        assert not missing, f"{route.pattern}: no value for path parameter(s) {missing}"
        kwargs = {p: values[p] for p in route.params}
        if route.regex:  # only Django's admin uses regular expressions
            return reverse(f"{route.namespace}:{route.name}", kwargs=kwargs)
        path = route.pattern
        for name, value in kwargs.items():
            path = re.sub(rf"<(?:\w+:)?{name}>", str(value), path)
        return "/" + path


def _client(user: Any = None, key: str | None = None) -> Client:
    client = Client(HTTP_AUTHORIZATION=f"Bearer {key}") if key else Client()
    if user is not None:
        client.force_login(user)
    return client


@pytest.fixture(scope="module")
def world(
    django_db_setup: Any, django_db_blocker: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[World]:
    """Built once for the module, inside a transaction rolled back at its end."""
    storage = {
        "BACKEND": "transparency.storage.WriteOnceFileStorage",
        "OPTIONS": {"location": str(tmp_path_factory.mktemp("exports"))},
    }
    with (
        django_db_blocker.unblock(),
        override_settings(SAGAPLANE_EXPORT_STORAGE=storage),
        transaction.atomic(),
    ):
        acme = founding.create_tenant(
            "acme", "Acme Payments", "founder@acme.example", actor=named_actor("test")
        )
        bravo = founding.create_tenant(
            "bravo", "Bravo Logistics", "founder@bravo.example", actor=named_actor("test")
        )
        clients: dict[str, Client] = {"anonymous": Client()}
        for scope in KEY_SCOPES:
            _, raw = in_tenant(
                services.create_api_key,
                acme,
                NewApiKey(name=f"only-{scope}", scopes=[scope]),
                actor=named_actor("test"),
            )
            clients[f"key:{scope}"] = _client(key=raw)
        for role in ROLES:
            member = in_tenant(
                services.add_member, acme, f"{role}@acme.example", role, actor=named_actor("test")
            )
            clients[f"member:{role}"] = _client(user=member.user)
        outsider = in_tenant(
            services.add_member, bravo, "owner@bravo.example", Role.OWNER, actor=named_actor("test")
        )
        clients["outsider"] = _client(user=outsider.user)

        # acme's objects, for path parameters: a sealed saga in a signed log, a finished export,
        # a spare key, a member to act on and an invitation.
        writer = Writer(acme, "agent-acme-1")
        writer.saga("acme-saga-1")
        settle(acme)
        Writer(bravo, "agent-bravo-1").saga("bravo-saga-1")
        settle(bravo)  # the outsider's own log is signed too: what they read there is theirs
        size = proofs_size(acme)
        export = in_tenant(transparency.request_export, acme, actor=named_actor("test"))
        build_export_in(acme, export.pk)
        spare, _ = in_tenant(
            services.create_api_key, acme, NewApiKey(name="spare", scopes=["read"]), actor=named_actor("test")
        )
        target = in_tenant(
            services.add_member, acme, "target@acme.example", Role.VIEWER, actor=named_actor("test")
        )
        inviter = in_tenant(
            services.add_member, acme, "inviter@acme.example", Role.ADMIN, actor=named_actor("test")
        )
        budget = in_tenant(
            fleet.create_budget,
            acme,
            fleet.BudgetCreate.parse({"name": "spend", "max_total": 100, "window_s": 60}),
            actor=named_actor("test"),
        )
        rate_limit = in_tenant(
            fleet.create_rate_limit,
            acme,
            fleet.RateLimitCreate.parse({"name": "calls", "max_calls": 10, "window_s": 60}),
            actor=named_actor("test"),
        )
        halt = in_tenant(
            fleet.halt,
            acme,
            fleet.HaltCreate.parse({"scope": "tool:payments.*", "reason": "access table"}),
            actor=named_actor("test"),
        )
        breaker_fields = {
            "name": "payments down",
            "tool": "payments.*",
            "consecutive_failures": 5,
            "failure_rate": 0.5,
            "min_volume": 20,
            "window_s": 60,
            "cool_down_s": 30,
        }
        breaker = in_tenant(
            fleet.create_breaker, acme, fleet.BreakerCreate.parse(breaker_fields), actor=named_actor("test")
        )
        approval_policy = in_tenant(
            approvals.create_policy,
            acme,
            approvals.PolicyCreate.parse({"name": "wires", "tool": "bank.*"}),
            actor=named_actor("test"),
        )
        wire = GateRequest(saga_id="acme-saga-1", step_id="w1", tool="bank.wire", args={"amount": 5})
        pending = in_statements(fleet.evaluate, acme, wire, actor=named_actor("test"))
        compensated_saga(writer, "acme-refunded")
        (check,) = in_tenant(reconciliation.scan, acme)
        recovery_job = escalated_job(acme)
        witness = in_tenant(
            witnesses.add_witness,
            acme,
            witnesses.WitnessAdd.parse({"name": "w1", "url": "http://127.0.0.1:9/", "vkey": _witness_vkey()}),
            actor=named_actor("test"),
        )
        by_route = {
            "integrations/slack/link/<str:token>": {"token": slack.link_token(acme, "T0ACME", "U0LINK")}
        }
        values = {
            "stream_id": writer.stream_id,
            "saga_id": "acme-saga-1",
            "pk": spare.pk,
            "key_id": spare.pk,
            "membership_id": target.pk,
            "budget_id": budget.pk,
            "rate_limit_id": rate_limit.pk,
            "halt_id": halt.pk,
            "breaker_id": breaker.pk,
            "lease_id": outstanding_lease(acme, "acme-leased"),
            "reservation_id": open_reservation(acme, "acme-reserved"),
            "policy_id": approval_policy.pk,
            "approval_id": pending["approval_id"],
            "check_id": check.pk,
            "job_id": str(recovery_job.pk),
            "export_id": export.pk,
            "witness_id": witness.pk,
            "level": 0,
            "tile": f"000.p/{size}",
            "bundle": f"000.p/{size}",
            "token": invitations.make_token(acme, "invitee@acme.example", Role.VIEWER, inviter.user),
            # Django's admin
            "object_id": "1",
            "id": "1",
            "content_type_id": 1,
            "app_label": sorted({model._meta.app_label for model in admin.site._registry})[0],
        }
        yield World(clients, values, by_route)
        transaction.set_rollback(True)


def _witness_vkey() -> str:
    from sagaplane import cosignature

    return cosignature.generate_cosigner("witness.test/w1").verifier.encode()


def proofs_size(tenant: Tenant) -> int:

    with tenant_context(tenant):
        checkpoint = proofs.latest_checkpoint()
    assert checkpoint is not None and 0 < checkpoint.size < 256, "one partial tile is enough here"
    return checkpoint.size


# ------------------------------------------------------------------------------------- expected


def expected(
    spec: Api | Page | Public | Signed | SignedIn | AdminSite, method: str, principal: str, params: bool
) -> Outcome:
    """What `principal` must get from `method` on a route of this kind."""
    kind, _, name = principal.partition(":")
    if isinstance(spec, Public | AdminSite):
        return spec.methods.get(method, 405)
    if isinstance(spec, Signed):
        return 401 if method in spec.methods else 405
    if isinstance(spec, SignedIn):
        if method not in spec.methods:
            return 405
        return OK if kind in ("member", "outsider") else LOGIN
    if isinstance(spec, Page):
        if method not in spec.methods:
            return 405
        roles = spec.methods[method]
        if kind in ("key", "anonymous"):
            return LOGIN
        role = "owner" if kind == "outsider" else name
        if role not in roles:
            return 403
        return 404 if kind == "outsider" and params else OK
    allowed = spec.methods.get(method)
    if allowed is None:
        return 405
    if kind == "anonymous":
        return 401
    if kind == "key":
        return OK if name in allowed.keys else 403
    role = "owner" if kind == "outsider" else name
    if role not in allowed.roles:
        return 403
    # The outsider acts in their own tenant: acme's objects do not exist there.
    return 404 if kind == "outsider" and params else OK


# ------------------------------------------------------------------------------------ answering

# Writes a refused request may still make: authentication's last-used stamp and the session.
_BOOKKEEPING = re.compile(r'^UPDATE "tenants_apikey" SET "last_used_at"|"django_session"')
_WRITE = re.compile(r"^\s*(INSERT|UPDATE|DELETE)\b", re.I)


@dataclass(frozen=True)
class Answer:
    status: int
    location: str
    error: str | None
    writes: tuple[str, ...]


def ask(client: Client, method: str, path: str, api: bool) -> Answer:
    """One request in a transaction rolled back afterwards (and the client's cookies restored),
    so no request sees another's effects."""
    cookies = copy.deepcopy(client.cookies)
    body: dict[str, Any] = {}
    if method != "GET":
        body = (
            {"data": "{}", "content_type": "application/json"}
            if api
            else {"data": "", "content_type": "application/x-www-form-urlencoded"}
        )
    with transaction.atomic(), CaptureQueriesContext(connection) as queries:
        response = client.generic(method, path, **body)
        if getattr(response, "streaming", False):
            b"".join(response.streaming_content)  # type: ignore[attr-defined]  # closed by the client
        transaction.set_rollback(True)
    client.cookies = cookies
    error = None
    if response.get("Content-Type", "").startswith("application/json") and not getattr(
        response, "streaming", False
    ):
        payload = response.json()
        error = payload.get("error") if isinstance(payload, dict) else None
    writes = tuple(
        q["sql"]
        for q in queries.captured_queries
        if _WRITE.match(q["sql"]) and not _BOOKKEEPING.search(q["sql"])
    )
    return Answer(response.status_code, response.get("Location", ""), error, writes)


def mismatch(outcome: Outcome, answer: Answer, api: bool) -> str | None:
    """Why `answer` is not `outcome`, or None when it is."""
    if answer.status >= 500:
        return f"answered {answer.status}"
    refused = answer.status in (401, 403, 404, 405)
    if outcome == OK:
        if refused or (answer.status == 302 and answer.location.startswith(("/login/", "/admin/login/"))):
            return f"expected through, got {answer.status} {answer.location or answer.error or ''}".rstrip()
        return None
    if answer.writes:
        return f"refused ({answer.status}) but wrote: {answer.writes[0][:120]}"
    if outcome in (LOGIN, ADMIN_LOGIN):
        target = "/login/" if outcome == LOGIN else "/admin/login/"
        if answer.status != 302 or not answer.location.startswith(target):
            return f"expected a redirect to {target}, got {answer.status} {answer.location}".rstrip()
        return None
    if answer.status != outcome:
        return f"expected {outcome}, got {answer.status} {answer.error or answer.location}".rstrip()
    if api and refused and answer.error is None:
        return f"{answer.status} without the JSON error shape"
    return None


# ----------------------------------------------------------------------------------------- tests


def test_every_route_has_exactly_one_entry_and_its_declared_methods() -> None:
    """A new route fails here until the table says who may call it; a stale entry fails too. For
    tenant routes the table's methods are the ones the view itself declares (`access`)."""
    entries = {route.entry for route in ROUTES}
    assert sorted(entries - EXPECTED.keys()) == [], "routes with no entry in EXPECTED"
    assert sorted(EXPECTED.keys() - entries) == [], "entries in EXPECTED naming no route"
    for route in ROUTES:
        spec = EXPECTED[route.entry]
        if not isinstance(spec, Api | Page | Signed):
            continue
        view_class = getattr(route.view, "view_class", None)  # DRF views; pages carry it themselves
        declared = getattr(view_class, "access", None) or getattr(route.view, "access", None)
        assert declared is not None, f"{route.pattern}: the view declares no access"
        assert set(declared) == set(spec.methods), f"{route.pattern}: declares {set(declared)}"
        if isinstance(spec, Signed):  # a webhook's rule names its signer, and no key or role
            assert all(rule.signed_by for rule in declared.values()), f"{route.pattern}: not a signed rule"


@pytest.mark.django_db
@pytest.mark.parametrize("route", ROUTES, ids=[r.pattern or "/" for r in ROUTES])
def test_access_table(world: World, route: Route) -> None:
    spec = EXPECTED.get(route.entry)
    assert spec is not None, f"{route.pattern} has no entry in EXPECTED"
    path = world.path(route)
    api = isinstance(spec, Api | Signed)
    failures = []
    for method in METHODS:
        declared = method in spec.methods
        if isinstance(spec, AdminSite):
            if method != "GET":
                continue
            principals: tuple[str, ...] = PROBES
        else:
            principals = PRINCIPALS if declared else PROBES
        for principal in principals:
            outcome = expected(spec, method, principal, params=bool(route.params))
            if isinstance(spec, AdminSite):
                outcome = spec.by_name.get(route.name or "", outcome)
            answer = ask(world.clients[principal], method, path, api)
            why = mismatch(outcome, answer, api)
            if why:
                failures.append(f"{method} {path} as {principal}: {why}")
    assert failures == []


def test_a_handler_without_a_rule_fails_at_import() -> None:
    from django.core.exceptions import ImproperlyConfigured
    from rest_framework.views import APIView

    from tenants.access import READ as READ_RULE
    from tenants.permissions import TenantScopedViewMixin

    with pytest.raises(ImproperlyConfigured, match="POST"):

        class Forgetful(TenantScopedViewMixin, APIView):
            access = {"GET": READ_RULE}

            def get(self, request: Any) -> None: ...

            def post(self, request: Any) -> None: ...


@pytest.mark.django_db
def test_an_undeclared_method_is_405_naming_the_declared_ones(world: World) -> None:
    response = world.clients["member:owner"].put("/api/v1/sagas", "{}", content_type="application/json")
    assert response.status_code == 405 and response.json()["error"] == "method_not_allowed"
    assert response["Allow"] == "GET, HEAD"
    page = world.clients["member:owner"].post("/evidence/")
    assert page.status_code == 405 and page["Allow"] == "GET, HEAD"
