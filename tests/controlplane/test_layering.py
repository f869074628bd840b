"""The apps are layered, and imports only point down (docs/DESIGN-NOTES.md, "Layers").

Parsed, not imported: every `import` and `from ... import` anywhere in a module (a lazy import
inside a function is still a dependency) is checked against the layer table below. A module may
import its own layer and the layers below it. The evidence store (`audit`) tells the apps above
it what happened through `audit.hooks`, to which they subscribe in `AppConfig.ready`.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Lowest first. A module belongs to the longest prefix listed; a new module of a listed app falls
# in that app's layer, so adding one never needs this table unless it must sit lower.
LAYERS: list[tuple[str, list[str]]] = [
    # Mechanisms every app stands on, owned by none: tenant scoping and RLS, the tenant's epoch,
    # post-commit work, timing, numbers, metrics, per-tenant snapshots, leased-work claims. Core
    # imports no app (test_core_imports_no_app): it knows a tenant only by its id and shape.
    ("core", ["core"]),
    (
        "tenancy",
        [
            # Tenant, members and keys, who may do what, the view mixin, the fast routes' checks.
            "tenants",
            # Pieces of controlplane apps still import (CONTROLPLANE_IMPORTED below, which only
            # shrinks): the error shape as documented.
            "controlplane.schema",  # the error shape as documented (imports only DRF)
            "controlplane.config",
            "controlplane.celery",
            "controlplane.tracing",  # imports only OpenTelemetry
            "controlplane.postgres",  # Django's PostgreSQL backend with a bounded pool wait
        ],
    ),
    ("evidence store", ["audit"]),
    ("saga projection", ["sagas"]),
    ("transparency log", ["transparency"]),
    (
        "administration and features",
        [
            # The demo seed reads and writes every app (fleet's limits, the demo sagas' records).
            "tenants.management.commands.seed_demo",
            "fleet",
            "approvals",
            "recovery",  # takes over expired sagas; reads sagas, quarantines through fleet
            "passkeys",  # a person's WebAuthn credentials; approvals verify votes with them
            "reconciliation",  # reads sagas and records, signs with the log's key
        ],
    ),
    # Chat integrations act through the features' services (votes, halts), never the reverse.
    ("integrations", ["slackapp"]),
    ("pages and wiring", ["frontend", "controlplane"]),
]
APPS = {name.split(".")[0] for _, names in LAYERS for name in names}


def _layer_of(module: str) -> int | None:
    best: tuple[int, int] | None = None  # (prefix length, layer)
    for rank, (_, names) in enumerate(LAYERS):
        for name in names:
            if (module == name or module.startswith(name + ".")) and (best is None or len(name) > best[0]):
                best = (len(name), rank)
    return None if best is None else best[1]


def _modules() -> list[tuple[str, Path]]:
    out = []
    for app in sorted(APPS):
        for path in sorted((ROOT / app).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            out.append((".".join(p for p in parts if p != "__init__"), path))
    return out


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, dotted name) of every absolute import in the file, at any depth."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            # `from audit import hooks` names the module audit.hooks, not just the package.
            found.extend((node.lineno, f"{node.module}.{alias.name}") for alias in node.names)
    return found


def upward_imports() -> list[str]:
    problems = []
    for module, path in _modules():
        own = _layer_of(module)
        assert own is not None, module
        for line, name in _imports(path):
            if name.split(".")[0] not in APPS:
                continue
            target = _layer_of(name)
            if target is not None and target > own:
                problems.append(
                    f"{path.relative_to(ROOT)}:{line} {module} ({LAYERS[own][0]}) imports "
                    f"{name} ({LAYERS[target][0]})"
                )
    return problems


# Another app's modules another app may import: its commands and queries, the events it publishes,
# its models (foreign keys, model types) and its AppConfig.
PUBLIC_MODULES = frozenset({"services", "selectors", "hooks", "models", "apps"})
# The ground every app stands on: core, the controlplane pieces still imported, and the tenancy
# modules every app uses (who may do what, the view mixin, actors, API-key authentication and the
# fast routes' checks). Importable from anywhere.
GROUND = frozenset(
    ["core"]
    + [name for _, names in LAYERS[:2] for name in names if name.split(".")[0] == "controlplane"]
    + [
        f"tenants.{name}"
        for name in ("access", "permissions", "actors", "authentication", "fastroute", "entry")
    ]
)
# (importing module, imported module) pairs that pass another app's public modules today, each
# with why. The list only shrinks: fix the import, then delete its entry.
KNOWN_EXCEPTIONS: dict[tuple[str, str], str] = {
    # The gate's request value; approvals and the fleet page build one (issue 25 steps 5 and 7).
    ("approvals.actions.gate", "fleet.gate"): "GateRequest, Debit, from_units: the gate's input",
    ("approvals.actions.policies", "fleet.gate"): "GateRequest, tool_matches: which policy a call matches",
    ("approvals.actions.requests", "fleet.gate"): "GateRequest, the call a request is opened for",
    ("frontend.fleet_views", "fleet.gate"): "GateRequest, for the page's dry-run form",
    # The fast gate route calls fleet's gate_call.
    ("controlplane.gate_asgi", "fleet.calls"): "gate_call",
    # The sweeper's liveness, for /healthz and the pages' banner.
    ("controlplane.health", "recovery.sweeper"): "the sweeper's status",
    ("frontend.recovery_views", "recovery.sweeper"): "the sweeper's status",
    ("frontend.views", "recovery.sweeper"): "the sweeper's status",
    # Log redaction configured with the request observability (issue 25: controlplane straddles).
    ("controlplane.observability", "frontend.log_redaction"): "the invitation-token redaction",
    # Wiring: the websocket route's consumer (ASGI routing).
    ("controlplane.routing", "sagas.consumers"): "the /ws/events consumer",
    # Witness pages read and change witnesses through the module that owns them.
    ("frontend.evidence_views", "transparency.witnesses"): "the witness policy",
    ("frontend.witness_views", "transparency.witnesses"): "witness administration",
    # The evidence store's JSON value helpers, shared by the apps above it.
    ("reconciliation.services", "audit.jsonvalues"): "JSON value checks",
    ("sagas.api", "audit.jsonvalues"): "JSON value checks",
    ("sagas.services", "audit.jsonvalues"): "JSON value checks",
    ("transparency.bundles", "audit.jsonvalues"): "JSON value checks",
    ("transparency.actions.seals", "audit.jsonvalues"): "JSON value checks",
    # Reconciliation posts its verdicts with recovery's signed webhook sender.
    ("reconciliation.tasks", "recovery.webhook"): "the signed webhook",
    # Recovery keeps webhook secrets encrypted under the master keys, as the log's signing seed is.
    ("recovery.actions.webhooks", "transparency.keys"): "encrypt_seed, decrypt_seed",
}


def _app_module(name: str) -> str:
    """The module an import names, to the depth the public-module rule judges (app.module)."""
    return ".".join(name.split(".")[:2])


def imports_past_public_modules() -> dict[tuple[str, str], list[str]]:
    """(importing module, imported module) -> where, for every import of another app's module that
    is neither public nor ground."""
    found: dict[tuple[str, str], list[str]] = {}
    for module, path in _modules():
        for line, name in _imports(path):
            parts = name.split(".")
            if parts[0] not in APPS or parts[0] == module.split(".")[0]:
                continue
            target = _app_module(name)
            in_ground = any(target == name or target.startswith(name + ".") for name in GROUND)
            if (len(parts) > 1 and parts[1] in PUBLIC_MODULES) or in_ground:
                continue
            found.setdefault((module, target), []).append(f"{path.relative_to(ROOT)}:{line}")
    return found


def test_another_app_is_imported_through_its_public_modules() -> None:
    new = {
        pair: where for pair, where in imports_past_public_modules().items() if pair not in KNOWN_EXCEPTIONS
    }
    assert new == {}, "import another app through its services, selectors, hooks or models"


def test_the_known_exceptions_only_shrink() -> None:
    gone = sorted(set(KNOWN_EXCEPTIONS) - set(imports_past_public_modules()))
    assert gone == [], "these imports are gone: delete their KNOWN_EXCEPTIONS entries"


def test_imports_only_point_down() -> None:
    assert upward_imports() == []


# Modules of controlplane (the wiring: settings, URLs, ASGI, Celery, health) that modules outside
# it import today, each with why. The list only shrinks: move the piece into core, then delete it.
CONTROLPLANE_IMPORTED: dict[str, str] = {
    "controlplane.schema": "ErrorSerializer, the error shape in the OpenAPI schema (goes with errors)",
}


def controlplane_imports() -> dict[str, list[str]]:
    """controlplane module -> where, for every import of controlplane by a module outside it."""
    found: dict[str, list[str]] = {}
    for module, path in _modules():
        if module.split(".")[0] == "controlplane":
            continue
        for line, name in _imports(path):
            if name.split(".")[0] == "controlplane":
                found.setdefault(_app_module(name), []).append(f"{path.relative_to(ROOT)}:{line}")
    return found


def test_no_app_imports_controlplane() -> None:
    # controlplane is wiring: it imports the apps, and the apps reach it only through settings.
    new = {name: where for name, where in controlplane_imports().items() if name not in CONTROLPLANE_IMPORTED}
    assert new == {}, "put what apps share in core: controlplane is only wiring"


def test_the_controlplane_imports_only_shrink() -> None:
    gone = sorted(set(CONTROLPLANE_IMPORTED) - set(controlplane_imports()))
    assert gone == [], "these imports are gone: delete their CONTROLPLANE_IMPORTED entries"


def test_core_imports_no_app() -> None:
    imported = {
        f"{path.relative_to(ROOT)}:{line} {name}"
        for module, path in _modules()
        if module.split(".")[0] == "core"
        for line, name in _imports(path)
        if name.split(".")[0] in APPS - {"core"}
    }
    assert imported == set()


def test_tenancy_imports_no_evidence_store() -> None:
    # tenants sits below audit: its changes write their audit records through core.actionaudit
    # (the evidence store's writer, registered in audit's AppConfig.ready).
    imported = {
        f"{path.relative_to(ROOT)}:{line} {name}"
        for module, path in _modules()
        if module.split(".")[0] == "tenants" and _layer_of(module) == 1
        for line, name in _imports(path)
        if name.split(".")[0] == "audit"
    }
    assert imported == set()


def test_the_evidence_store_imports_no_app_built_on_it() -> None:
    above = ("sagas", "transparency", "frontend", "fleet", "approvals")
    imported = {
        name
        for module, path in _modules()
        if module.split(".")[0] == "audit"
        for _, name in _imports(path)
        if name.split(".")[0] in above
    }
    assert imported == set()


def test_the_gate_imports_nothing_of_approvals() -> None:
    # One way only: approvals plug their step into the gate through fleet.hooks (registered in
    # approvals' AppConfig.ready) and call fleet's services; fleet never imports approvals.
    imported = {
        name
        for module, path in _modules()
        if module.split(".")[0] == "fleet"
        for _, name in _imports(path)
        if name.split(".")[0] == "approvals"
    }
    assert imported == set()


def _asks_which_database(path: Path) -> list[int]:
    """Lines of `path` that ask which database this is: a `.vendor` or an `is_postgres`."""
    return sorted(
        node.lineno
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if (isinstance(node, ast.Attribute) and node.attr in ("vendor", "is_postgres"))
        or (isinstance(node, ast.Name) and node.id == "is_postgres")
        or (isinstance(node, ast.alias) and node.name == "is_postgres")
    )


def vendor_branches() -> list[str]:
    """Where a module other than an app's `queries`, core or a migration asks which database this is."""
    return [
        f"{path.relative_to(ROOT)}:{line}"
        for module, path in _modules()
        if module.split(".")[0] != "core"
        and module.split(".")[-1] != "queries"
        and "migrations" not in module.split(".")
        for line in _asks_which_database(path)
    ]


def test_sql_for_one_database_is_in_the_apps_queries_modules() -> None:
    # Each app's SQL written for one database is in its queries.py, each query with a parity test
    # (tests/<app>/test_queries.py, run on Postgres and on SQLite); the rest speaks the ORM.
    assert vendor_branches() == []


def test_a_vendor_branch_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "sagas").mkdir()
    (tmp_path / "sagas" / "fast.py").write_text(
        "from django.db import connection\nfrom core.sql import is_postgres\n"
        "def f():\n    return connection.vendor == 'postgresql' or is_postgres()\n"
    )
    (tmp_path / "sagas" / "queries.py").write_text("from core.sql import is_postgres\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert vendor_branches() == ["sagas/fast.py:2", "sagas/fast.py:4", "sagas/fast.py:4"]


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("from sagas import services\n", ["sagas.services"]),
        (
            "def f():\n    from transparency.hooks import records_committed\n",
            ["transparency.hooks.records_committed"],
        ),
        ("import frontend.views\n", ["frontend.views"]),
    ],
)
def test_the_parser_sees_every_form_of_import(tmp_path: Path, source: str, expected: list[str]) -> None:
    # The checks above are only as good as this: top-level, lazy and plain imports are all found.
    module = tmp_path / "m.py"
    module.write_text(source)
    assert [name for _, name in _imports(module)] == expected


def test_an_upward_import_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "audit").mkdir()
    (tmp_path / "audit" / "leak.py").write_text("from sagas.services import rebuild_saga\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert upward_imports() == [
        "audit/leak.py:1 audit.leak (evidence store) imports sagas.services.rebuild_saga (saga projection)"
    ]


def test_an_import_past_the_public_modules_is_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "frontend").mkdir()
    (tmp_path / "frontend" / "page.py").write_text(
        "from fleet.services import evaluate\n"
        "from fleet import models\n"
        "from core.scoping import tenant_context\n"
        "from fleet.stores import RedisStore\n"
    )
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert imports_past_public_modules() == {("frontend.page", "fleet.stores"): ["frontend/page.py:4"]}


# -- entering a tenant --------------------------------------------------------------------------
# A tenant is entered once per transport (docs/ARCHITECTURE.md §1): a request by the view mixin, a
# Celery task by tenants.entry.tenant_task, a command by tenants.entry.command_tenant; services and
# actions assert the scope (core.scoping.require_tenant) and never open one. `tenant_context` (and
# `joined_tenant_context`) appear only in the mechanism and the transports; a walker that crosses
# tenants on purpose (a beat task: the sweeps, the integrator) is a task entering one after another.
ENTERS_TENANTS = ("tenant_context", "joined_tenant_context")
TRANSPORT_SUFFIXES = ("tasks", "api", "views", "consumers")
TENANT_ENTRY_MODULES: dict[str, str] = {
    "core.scoping": "the mechanism",
    "tenants.entry": "the task decorator, the command helper, a person's change in each of their tenants",
    "tenants.permissions": "the view mixin",
    "tenants.founding": "a new tenant: it creates the tenant, then enters it once for its owner and record",
    "approvals.compat": "agent-saga's requests, opened after an ingest commits, each its own transaction",
    "tenants.selectors": "an API key's row, read in the tenant a cross-tenant question found for it",
    "tenants.authentication": "an API key is looked up before its tenant is known, then entered",
    "transparency.lean": "the proofs' fast route (a transport beside the view mixin)",
    "fleet.actions.store": "ledger_since: the Redis store's rebuild reads a tenant's ledger by its id, "
    "from a gate decision or the outage probe across tenants",
}


def _is_transport(module: str) -> bool:
    parts = module.split(".")
    return (
        module in TENANT_ENTRY_MODULES
        or parts[0] in ("frontend", "controlplane")  # pages and wiring: requests
        or "commands" in parts[:-1]  # management commands
        or parts[-1] in TRANSPORT_SUFFIXES
        or parts[-1].endswith("_views")
    )


def _enters_tenants(path: Path) -> list[int]:
    """Lines of `path` that name `tenant_context` or `joined_tenant_context` (a call, an import)."""
    return sorted(
        node.lineno
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if (isinstance(node, ast.Name) and node.id in ENTERS_TENANTS)
        or (isinstance(node, ast.Attribute) and node.attr in ENTERS_TENANTS)
        or (isinstance(node, ast.ImportFrom) and any(a.name in ENTERS_TENANTS for a in node.names))
    )


def modules_entering_tenants() -> dict[str, list[str]]:
    """module -> where, for every module other than a transport or a walker that enters a tenant."""
    return {
        module: [f"{path.relative_to(ROOT)}:{line}" for line in lines]
        for module, path in _modules()
        if "migrations" not in module.split(".") and not _is_transport(module)
        for lines in [_enters_tenants(path)]
        if lines
    }


def test_services_assert_the_tenant_instead_of_entering_it() -> None:
    assert modules_entering_tenants() == {}, (
        "enter the tenant at the transport; assert it with core.scoping.require_tenant"
    )


def test_a_service_entering_a_tenant_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "sagas" / "management" / "commands").mkdir(parents=True)
    (tmp_path / "sagas" / "fresh.py").write_text(
        "from core import scoping\n\ndef f(t):\n    with scoping.tenant_context(t):\n        pass\n"
    )
    (tmp_path / "sagas" / "tasks.py").write_text("from core.scoping import tenant_context\n")
    (tmp_path / "sagas" / "management" / "commands" / "go.py").write_text(
        "from core.scoping import joined_tenant_context\n"
    )
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert modules_entering_tenants() == {"sagas.fresh": ["sagas/fresh.py:4"]}
