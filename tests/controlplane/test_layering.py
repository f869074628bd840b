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
    (
        "tenancy ground",
        [
            # Tenant, TenantScopedModel, tenant_context, members and keys, who may do what.
            "tenants",
            "controlplane.postcommit",
            "controlplane.errors",
            "controlplane.schema",  # the error shape as documented (imports only DRF)
            "controlplane.config",
            "controlplane.longpoll",  # imports only django.db
            "controlplane.celery",
            "controlplane.tracing",  # imports only OpenTelemetry
            "controlplane.metrics",  # imports only prometheus-client; apps may record and register
            "controlplane.timing",  # Server-Timing phases; imports only the standard library
            "controlplane.numbers",  # JSON number checks; imports only the standard library
            "controlplane.statistics",  # a migration operation; imports only django.db
            "controlplane.outbound",  # the outbound-address guard; imports only django.conf
            # The gate's refusal while a store is down; imports controlplane.errors, the backend's
            # wait bound and, lazily, django.db and the drivers.
            "controlplane.availability",
            "controlplane.postgres",  # Django's PostgreSQL backend with a bounded pool wait
            # Mechanisms every app stands on; core.fastroute stands on tenants' key check and rules.
            "core",
        ],
    ),
    ("evidence store", ["audit"]),
    ("saga projection", ["sagas"]),
    ("transparency log", ["transparency"]),
    # Tenant administration writes its audit records through audit.services.
    (
        "administration and features",
        [
            "tenants.services",
            "tenants.api",
            "tenants.urls",
            "tenants.admin",
            "tenants.management",
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


def test_imports_only_point_down() -> None:
    assert upward_imports() == []


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
