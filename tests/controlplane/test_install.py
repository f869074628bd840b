"""Reproducible installs: requirements.lock pins every third-party package the server and its dev
tools need, the environment the suite runs in was installed from it, and the server's own
distribution declares every package its code imports (`pip install ./sdk .` is a working server)."""

from __future__ import annotations

import ast
import sys
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
# The server's packages, as its distribution finds them ("controlplane*", ...).
SERVER_PACKAGES = [
    pattern.rstrip("*") for pattern in PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]
]
LOCAL = {"sagaplane", "sagaplane-server"}  # installed from this tree, never from an index


def locked() -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        requirement = Requirement(line.split(";", 1)[0].strip())
        (specifier,) = requirement.specifier
        assert specifier.operator == "==", f"requirements.lock: {line!r} is not an exact pin"
        pins[canonicalize_name(requirement.name)] = specifier.version
    return pins


def project_requirements(*, extras: tuple[str, ...] = ()) -> list[Requirement]:
    project = PYPROJECT["project"]
    lines = list(project["dependencies"])
    for extra in extras:
        lines += project["optional-dependencies"][extra]
    return [Requirement(line) for line in lines]


def applies(requirement: Requirement, extras: set[str]) -> bool:
    if requirement.marker is None:
        return True
    return any(
        requirement.marker.evaluate({**default_environment(), "extra": extra}) for extra in extras or {""}
    )


def closure(roots: list[Requirement]) -> dict[str, set[str]]:
    """Every distribution `roots` need in this interpreter, with the extras asked of each."""
    needed: dict[str, set[str]] = {}
    pending = [(root, set(root.extras)) for root in roots]
    while pending:
        requirement, extras = pending.pop()
        name = canonicalize_name(requirement.name)
        known = needed.setdefault(name, set())
        if known and extras <= known:
            continue
        known |= extras
        for line in metadata.requires(requirement.name) or []:
            child = Requirement(line)
            if applies(child, extras):
                pending.append((child, set(child.extras)))
    return needed


def test_the_lock_pins_everything_the_server_and_its_tools_install_at_the_installed_version():
    pins = locked()
    needed = closure(project_requirements(extras=("dev",)))
    unpinned = sorted(name for name in needed if name not in pins and name not in LOCAL)
    assert not unpinned, f"needed but not in requirements.lock (run `make lock`): {unpinned}"
    drifted = {
        name: (metadata.version(name), pins[name])
        for name in needed
        if name not in LOCAL and metadata.version(name) != pins[name]
    }
    assert not drifted, f"installed (left) differs from requirements.lock (right): {drifted}"


def test_every_pin_satisfies_what_pyproject_asks():
    pins = locked()
    for requirement in project_requirements(extras=("dev",)):
        name = canonicalize_name(requirement.name)
        if name in LOCAL:
            continue
        assert name in pins, f"{requirement} is not in requirements.lock (run `make lock`)"
        assert requirement.specifier.contains(pins[name], prereleases=True), (
            f"requirements.lock pins {name}=={pins[name]}, outside {requirement} (run `make lock`)"
        )


def test_the_server_distribution_declares_every_package_its_code_imports():
    imported: set[str] = set()
    for package in SERVER_PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    imported |= {alias.name.split(".")[0] for alias in node.names}
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    imported.add(node.module.split(".")[0])
    third_party = imported - set(sys.stdlib_module_names) - set(SERVER_PACKAGES)
    providers = metadata.packages_distributions()
    declared = {canonicalize_name(r.name) for r in project_requirements()}
    missing = {}
    for module in sorted(third_party):
        distributions = {canonicalize_name(d) for d in providers.get(module, [])}
        assert distributions, f"nothing installed provides {module!r}"
        if not distributions & declared:
            missing[module] = sorted(distributions)
    assert not missing, f"imported by the server but not in [project] dependencies: {missing}"
    assert "sagaplane" in declared  # the SDK, which the server verifies chains with
