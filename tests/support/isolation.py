"""What an outsider may see of another tenant: every API route asked with the other tenant's own object
ids, by session and by key (the isolation tests of every layer; tests/tenants/test_isolation.py
says what is checked)."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.urls import URLPattern, URLResolver, get_resolver

from core.scoping import tenant_context
from tenants.actors import named_actor
from tenants.inputs import NewApiKey
from tenants.models import ApiKey, Tenant
from tests.support.chains import chain, ensure_sample, saga_records, sample_saga_id, sample_stream_id
from tests.support.factories import Person, open_reservation, outstanding_lease
from tests.support.scoping import in_statements, in_tenant

# Routes that are deliberately not tenant data.
PUBLIC_ROUTES = {"healthz", "readyz", "schema", "api-docs", "api-redoc"}


API_PREFIXES = ("api/", "v1/")


def _acme_api_key_id(tenant: Tenant, alice: Person) -> Any:
    with tenant_context(tenant):
        return ApiKey.objects.get(prefix=ApiKey.prefix_of(alice.api_key)).pk


def _acme_export_id(tenant: Tenant, alice: Person) -> Any:
    from transparency.models import Export

    with tenant_context(tenant):
        export = Export.objects.first() or Export.objects.create(tenant=tenant, requested_by="test")
        return export.pk


def _acme_tile(tenant: Tenant, alice: Person) -> str:
    """Acme's first level-0 tile, after integrating its log (a tile exists only once signed)."""
    from transparency import services as transparency
    from transparency.tasks import integrate_fully

    sample_stream_id(tenant, alice)
    in_tenant(transparency.ensure_signing_key, tenant)
    integrate_fully(tenant)
    size = _tree_size(tenant)
    return "000" if size >= 256 else f"000.p/{size}"


def _tree_size(tenant: Tenant) -> int:
    from transparency.models import TreeState

    with tenant_context(tenant):
        return TreeState.objects.get().size


# URL parameter name -> how to get acme's value for it. Apps add their own parameters here.
def _acme_fleet(tenant: Tenant) -> tuple[int, int, int]:
    """The tenant's sample budget, rate limit and halt (created once)."""
    from fleet import services as fleet
    from fleet.models import BudgetLimit, Halt, RateLimit

    with tenant_context(tenant):
        budget = BudgetLimit.objects.filter(name="sample-spend").first()
        rate = RateLimit.objects.filter(name="sample-calls").first()
        halt = Halt.objects.filter(reason="sample halt").first()
    budget = budget or in_tenant(
        fleet.create_budget,
        tenant,
        fleet.BudgetCreate.parse({"name": "sample-spend", "max_total": 5, "window_s": 60}),
        actor=named_actor("test"),
    )
    rate = rate or in_tenant(
        fleet.create_rate_limit,
        tenant,
        fleet.RateLimitCreate.parse({"name": "sample-calls", "max_calls": 5, "window_s": 60}),
        actor=named_actor("test"),
    )
    halt = halt or in_tenant(
        fleet.halt,
        tenant,
        fleet.HaltCreate.parse({"scope": "tool:sample.*", "reason": "sample halt"}),
        actor=named_actor("test"),
    )
    return budget.pk, rate.pk, halt.pk


def _acme_approval(tenant: Tenant) -> tuple[int, str]:
    """The tenant's sample approval policy and a pending request under it (created once)."""
    from approvals import services as approvals
    from approvals.models import ApprovalPolicy
    from fleet import services as fleet
    from fleet.gate import GateRequest

    with tenant_context(tenant):
        policy = ApprovalPolicy.objects.filter(name="sample-approval").first()
    policy = policy or in_tenant(
        approvals.create_policy,
        tenant,
        approvals.PolicyCreate.parse({"name": "sample-approval", "tool": "approve.wire"}),
        actor=named_actor("test"),
    )
    call = GateRequest(saga_id="sample-approval-saga", step_id="1", tool="approve.wire", args={"amount": 1})
    return policy.pk, in_statements(fleet.evaluate, tenant, call, actor=named_actor("test"))["approval_id"]


def _acme_recovery_job(tenant: Tenant) -> str:
    """An escalated recovery job of acme's (a crashed saga whose step has no handler; made once)."""
    from recovery.models import Job
    from tests.recovery.sagas import escalated_job

    with tenant_context(tenant):
        job = Job.objects.filter(saga_id="acme-crashed").first()
    return str((job or escalated_job(tenant)).pk)


def _acme_reconciliation_check(tenant: Tenant) -> Any:
    """A reconciliation check of acme's: a saga its own rollback refunded (made once)."""
    from reconciliation import services as reconciliation
    from reconciliation.models import ReconciliationCheck
    from tests.support.chains import Writer, compensated_saga

    with tenant_context(tenant):
        check = ReconciliationCheck.objects.first()
    if check is None:
        compensated_saga(Writer(tenant, "agent-acme-refunds"), "acme-refunded")
        (check,) = in_tenant(reconciliation.scan, tenant)
    return check.pk


def _acme_witness(tenant: Tenant) -> int:
    from sagaplane import cosignature

    from transparency import witnesses
    from transparency.models import Witness

    with tenant_context(tenant):  # one per tenant: several routes ask for a witness id
        existing = Witness.objects.filter(name="acme-w").first()
    if existing is not None:
        return existing.pk
    vkey = cosignature.generate_cosigner("witness.test/acme").verifier.encode()
    new = witnesses.WitnessAdd.parse({"name": "acme-w", "url": "http://127.0.0.1:9", "vkey": vkey})
    return in_tenant(witnesses.add_witness, tenant, new, actor=named_actor("test")).pk


def _acme_breaker(tenant: Tenant) -> int:
    from fleet import services as fleet
    from fleet.models import CircuitBreaker

    with tenant_context(tenant):
        existing = CircuitBreaker.objects.filter(name="sample-breaker").first()
    if existing is not None:
        return existing.pk
    settings = {"consecutive_failures": 5, "failure_rate": "0.5", "min_volume": 10}
    breaker = fleet.BreakerCreate.parse(
        {"name": "sample-breaker", "tool": "sample.*", **settings, "window_s": 60, "cool_down_s": 30}
    )
    return in_tenant(fleet.create_breaker, tenant, breaker, actor=named_actor("test")).pk


SAMPLE: dict[str, Callable[[Tenant, Person], Any]] = {
    "pk": _acme_api_key_id,
    # transparency: acme's first hash tile, and an acme export
    "level": lambda tenant, alice: 0,
    "tile": _acme_tile,
    "bundle": _acme_tile,  # an entry bundle has the same <N>[.p/<W>] as acme's first level-0 tile
    "export_id": _acme_export_id,
    "stream_id": sample_stream_id,
    "saga_id": sample_saga_id,
    # fleet: acme's own budget, rate limit and halt
    "budget_id": lambda tenant, alice: _acme_fleet(tenant)[0],
    "rate_limit_id": lambda tenant, alice: _acme_fleet(tenant)[1],
    "halt_id": lambda tenant, alice: _acme_fleet(tenant)[2],
    "breaker_id": lambda tenant, alice: _acme_breaker(tenant),
    "lease_id": lambda tenant, alice: outstanding_lease(tenant, "acme-leased"),
    "reservation_id": lambda tenant, alice: open_reservation(tenant, "acme-reserved"),
    # approvals: acme's own policy and request
    "policy_id": lambda tenant, alice: _acme_approval(tenant)[0],
    "approval_id": lambda tenant, alice: _acme_approval(tenant)[1],
    # recovery and reconciliation: acme's own escalated job and verdict check
    "job_id": lambda tenant, alice: _acme_recovery_job(tenant),
    "check_id": lambda tenant, alice: _acme_reconciliation_check(tenant),
    "witness_id": lambda tenant, alice: _acme_witness(tenant),
}


def _walk(patterns: list, prefix: str = "") -> Iterator[tuple[str, URLPattern]]:
    for entry in patterns:
        if isinstance(entry, URLResolver):
            yield from _walk(entry.url_patterns, prefix + str(entry.pattern))
        elif isinstance(entry, URLPattern):
            yield prefix + str(entry.pattern), entry


def api_routes() -> list[tuple[str, URLPattern]]:
    return [
        (route, pattern)
        for route, pattern in _walk(get_resolver().url_patterns)
        if route.startswith(API_PREFIXES) and pattern.name not in PUBLIC_ROUTES
    ]


def view_class_of(pattern: URLPattern) -> type | None:
    return getattr(pattern.callback, "view_class", None) or getattr(pattern.callback, "cls", None)


def fill_route(route: str, tenant: Tenant, alice: Person) -> str:
    def value(match: re.Match) -> str:
        name = match.group(2)
        if name not in SAMPLE:
            pytest.fail(f"route {route!r} has parameter {name!r} with no acme sample in SAMPLE")
        return str(SAMPLE[name](tenant, alice))

    return "/" + re.sub(r"<(?:(\w+):)?(\w+)>", value, route)


def _fingerprints(tenant: Tenant, member: Person) -> list[str]:
    """Strings that would betray `tenant` if they showed up in anything an outsider receives."""
    from audit.models import Record

    sample = ensure_sample(tenant)
    with tenant_context(tenant):
        record_hashes = list(Record.objects.order_by("leaf_index").values_list("h", flat=True)[:50])
    prefix = ApiKey.prefix_of(member.api_key) or ""
    return [tenant.slug, tenant.name, prefix, member.user.email, *sample.markers, *record_hashes]


def _own_people(outsider: Person) -> dict[str, set[str]]:
    """The outsider tenant's own keys and members: all its listings may show."""
    from tenants.models import Membership

    with tenant_context(outsider.tenant):
        return {
            "prefixes": set(ApiKey.objects.values_list("prefix", flat=True)),
            "emails": set(Membership.objects.values_list("user__email", flat=True)),
        }


def _lists_in(value: Any) -> Iterator[list]:
    if isinstance(value, list):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _lists_in(item)


# Listings that show the outsider's own tenant, not only emptiness: how to check them exactly.
OWN_LISTINGS: dict[str, Callable[[Any, Person, dict[str, set[str]]], bool]] = {
    "api/v1/tenant": lambda body, outsider, own: body["tenant"]["slug"] == outsider.tenant.slug,
    "api/v1/keys": lambda body, outsider, own: {k["prefix"] for k in body["results"]} == own["prefixes"],
    "api/v1/members": lambda body, outsider, own: {m["email"] for m in body["results"]} == own["emails"],
}


def _assert_listing_is_empty_or_own(
    route: str, response: Any, outsider: Person, own: dict[str, set[str]]
) -> None:
    """The outsider has no evidence of its own (only its server stream): every list in a listing
    it receives is empty, except the few that list its own tenant, which hold exactly that."""
    if response.status_code != 200 or not response.get("Content-Type", "").startswith("application/json"):
        return
    body = response.json()
    if route in OWN_LISTINGS:
        assert OWN_LISTINGS[route](body, outsider, own), (
            f"{outsider.tenant.slug}'s {route} is not its own: {body}"
        )
        return
    for found in _lists_in(body):
        assert found == [], f"{outsider.tenant.slug}'s {route} lists {found[:3]} (it has nothing to list)"
    if isinstance(body, dict) and "count" in body:
        assert body["count"] == 0, f"{outsider.tenant.slug}'s {route} counts {body['count']}"


def assert_sees_nothing_of(outsider: Person, tenant: Tenant, member: Person) -> int:
    """Every API route, with `tenant`'s own object ids, asked by `outsider` (session and key)."""
    from sagas.models import Saga

    with tenant_context(outsider.tenant):
        assert not Saga.objects.exists(), "the outsider must hold no evidence: its listings are then empty"
    urls = [(route, fill_route(route, tenant, member)) for route, _ in api_routes()]
    fingerprints = _fingerprints(tenant, member)
    own = _own_people(outsider)
    checked = 0
    for route, url in urls:
        clients = (("session", outsider.session_client()), ("api key", outsider.key_client()))
        for client_name, client in clients:
            response = client.get(url)
            if response.status_code == 405:
                continue  # a write-only route: nothing to read
            body = response.content.decode(errors="replace")
            if "<" in route:
                assert response.status_code in (403, 404), (
                    f"{outsider.tenant.slug} ({client_name}) got {response.status_code} for "
                    f"{tenant.slug}'s {url}: {body[:300]}"
                )
            else:
                _assert_listing_is_empty_or_own(route, response, outsider, own)
            for fingerprint in fingerprints:
                assert fingerprint not in body, (
                    f"{outsider.tenant.slug} ({client_name}) saw {tenant.slug}'s {fingerprint!r} at {url}"
                )
            checked += 1
    # And nothing the outsider lists depends on how much the other tenant holds.
    listings = [(route, url) for route, url in urls if "<" not in route]
    before = _answers(outsider, listings)
    _grow(tenant)
    after = _answers(outsider, listings)
    changed = sorted(key for key in before if before[key] != after[key])
    assert not changed, f"{outsider.tenant.slug}'s answers changed when {tenant.slug} grew: {changed}"
    return checked


def _answers(outsider: Person, urls: list[tuple[str, str]]) -> dict[tuple[str, str], tuple[int, str]]:
    """The outsider's answers on the routes without parameters, minus timestamps (`*_at`)."""

    def steady(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: steady(v) for k, v in value.items() if not k.endswith("_at")}
        if isinstance(value, list):
            return [steady(v) for v in value]
        return value

    out = {}
    for route, url in urls:
        for client_name, client in (("session", outsider.session_client()), ("key", outsider.key_client())):
            response = client.get(url)
            is_json = response.get("Content-Type", "").startswith("application/json")
            body = repr(steady(response.json())) if is_json else response.content.decode(errors="replace")
            out[(route, client_name)] = (response.status_code, body)
    return out


def _grow(tenant: Tenant) -> None:
    """More of everything in `tenant`: a saga on a new stream, a key, a member, an export."""
    from audit.services import ingest
    from tenants import services
    from transparency.models import Export

    suffix = uuid.uuid4().hex[:8]
    in_tenant(
        ingest,
        tenant,
        f"st-grown-{suffix}",
        chain(saga_records(name=f"grown-{suffix}")),
        actor=named_actor("test"),
    )
    in_tenant(
        services.create_api_key,
        tenant,
        NewApiKey(name=f"grown-{suffix}", scopes=["read"]),
        actor=named_actor("test"),
    )
    in_tenant(
        services.add_member,
        tenant,
        f"grown-{suffix}@{tenant.slug}.example",
        "viewer",
        "x" * 12,
        actor=named_actor("test"),
    )
    with tenant_context(tenant):
        Export.objects.create(tenant=tenant, requested_by="test")
