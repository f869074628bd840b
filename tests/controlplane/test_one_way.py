"""One way to do each thing (issue 25; docs/ARCHITECTURE.md §1): the shared mechanisms that speed
work had re-implemented stay single. Parsed, not imported, as tests/controlplane/test_layering.py
does, on the server's shipped modules (the apps: not the SDK, tests, benchmarks or migrations);
the last two checks read the tests themselves. Each check has a test that it reports a violation.

- one error class for refusals (core.errors.DomainError); any other exception class is internal;
- actors built and their stored strings read in core/actors.py and tenants/actors.py only;
- record kinds named by the SDK's enum (sagaplane.events.Event), never as string literals;
- leased work claimed (its fencing token raised) only by core/claims.py;
- per-process caches of tenants' data only through core/snapshots.py;
- tests share helpers through tests/support/ (never a test module, nor a conftest), waiting
  through its wait_until.
"""

from __future__ import annotations

import ast
import builtins
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOT_SERVER = frozenset({"sdk", "tests", "bench", "infra", "docs"})


def _server_modules() -> list[tuple[str, Path]]:
    """(dotted name, path) of every module of the apps (a top-level package), but migrations."""
    out = []
    for app in sorted(ROOT.iterdir()):
        if app.name in NOT_SERVER or not (app / "__init__.py").is_file():
            continue
        for path in sorted(app.rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if "migrations" not in parts:
                out.append((".".join(p for p in parts if p != "__init__"), path))
    return out


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def _strings(tree: ast.Module) -> Iterator[tuple[int, str]]:
    """(line, value) of every string literal of `tree` (f-strings' literal parts too) but docstrings."""
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            yield node.lineno, node.value


def _name(node: ast.expr) -> str:
    """The last name of `Name`, `a.b.Name` or `Name[...]` ("" for anything else)."""
    named = node.value if isinstance(node, ast.Subscript) else node
    if isinstance(named, ast.Attribute):
        return named.attr
    return named.id if isinstance(named, ast.Name) else ""


def _where(path: Path, line: int) -> str:
    return f"{path.relative_to(ROOT)}:{line}"


# -- one error class for refusals ----------------------------------------------------------------
# core.errors.DomainError (a subclass only where a caller catches that kind apart) is what every
# refusal a client or a person reads is raised as. Any other exception class of the apps is
# internal: control flow, infrastructure or a programming error, caught and turned into a
# DomainError, a verdict or a retry before anything is answered. Each with why; a new class that
# is answered is a DomainError instead.
INTERNAL_EXCEPTIONS: dict[str, str] = {
    "approvals.predicates.InvalidPredicate": "a predicate's parse failure, refused by its serializer field",
    "audit.api.DuplicateKey": "the JSON object hook's, refused as duplicate_key by the body parser",
    "controlplane.config.ConfigurationError": "settings refused at start, before any request",
    "controlplane.gate_asgi._HandOn": "control flow: the fast route hands the request to the full stack",
    "core.outbound.UnsafeAddress": "an OSError for the senders: a refused address is a failed delivery",
    "core.scoping.NeedsDatabase": "control flow: the lean gate path falls back to the database",
    "core.scoping.TenantScopeError": "a programming error (a 500), never a client's",
    "fleet.actions.writers._NotConsumable": "control flow inside the gate's writer",
    "fleet.gate.InvalidArgument": "answered as the gate's deny verdict (invalid_argument), not an error",
    "fleet.stores.StoreUnavailable": "infrastructure: answered as availability.Unavailable or a deny",
    "sagas.selectors.BadCursor": "a cursor's parse failure: the API refuses it, the page starts over",
    "slackapp.crypto.TokenUnreadable": "infrastructure: handled as Slack being unreachable",
    "slackapp.decisions.NotPostedYet": "the Celery task's retry signal",
}
_EXCEPTION_NAMES = frozenset(
    name
    for name, value in vars(builtins).items()
    if isinstance(value, type) and issubclass(value, BaseException)
) | {"ImproperlyConfigured"}


def exception_classes() -> dict[str, tuple[str, bool]]:
    """module.Class -> (where, whether it is a DomainError) for every exception class of the apps
    (a base that is a builtin exception, named *Error or *Exception, or an exception class of the
    apps; a class is known by its name alone, as the apps' are distinct)."""
    classes: dict[str, tuple[str, list[str], str]] = {}  # name -> (qualified, bases, where)
    for module, path in _server_modules():
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.ClassDef):
                bases = [_name(base) for base in node.bases]
                classes[node.name] = (f"{module}.{node.name}", bases, _where(path, node.lineno))
    domain = {"DomainError"}
    errors = set(_EXCEPTION_NAMES)
    changed = True
    while changed:  # to a fixed point: a subclass of a subclass is found on a later pass
        changed = False
        for name, (_, bases, _) in classes.items():
            is_error = any(b in errors or b.endswith(("Error", "Exception")) for b in bases)
            if is_error and name not in errors:
                errors.add(name)
                changed = True
            if any(b in domain for b in bases) and name not in domain:
                domain.add(name)
                changed = True
    return {
        qualified: (where, name in domain)
        for name, (qualified, _, where) in classes.items()
        if name in errors
    }


def exceptions_answered_as_their_own() -> list[str]:
    return sorted(
        f"{where} {qualified}"
        for qualified, (where, is_domain) in exception_classes().items()
        if not is_domain and qualified != "core.errors.DomainError" and qualified not in INTERNAL_EXCEPTIONS
    )


def test_a_refusal_is_a_domain_error() -> None:
    assert exceptions_answered_as_their_own() == [], (
        "raise core.errors.DomainError(code, detail, ...) (a subclass only where a caller catches it "
        "apart); an internal exception goes in INTERNAL_EXCEPTIONS with why it is never answered"
    )


def test_the_internal_exceptions_are_still_internal() -> None:
    found = exception_classes()
    stale = sorted(name for name in INTERNAL_EXCEPTIONS if name not in found or found[name][1])
    assert stale == [], "gone or now a DomainError: delete their INTERNAL_EXCEPTIONS entries"


@pytest.fixture
def tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty tree of apps in place of the repository's."""
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    return tmp_path


def _write(root: Path, name: str, source: str) -> None:
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    for package in path.relative_to(root).parents:
        if package != Path("."):
            (root / package / "__init__.py").touch()
    path.write_text(source)


def test_an_error_class_of_its_own_is_reported(tree: Path) -> None:
    _write(tree, "core/errors.py", "class DomainError(Exception):\n    pass\n")
    _write(
        tree,
        "sagas/refusals.py",
        "from core.errors import DomainError\n"
        "class Refused(DomainError): ...\n"
        "class Narrower(Refused): ...\n"
        "class Shown(ValueError): ...\n"
        "class Deeper(Shown): ...\n"
        "class NotAnError: ...\n",
    )
    assert exceptions_answered_as_their_own() == [
        "sagas/refusals.py:4 sagas.refusals.Shown",
        "sagas/refusals.py:5 sagas.refusals.Deeper",
    ]


# -- actors ------------------------------------------------------------------------------------
# Every Actor is built by tenants/actors.py and rendered, and its stored string read, by
# core/actors.py: no other module spells a stored actor's prefix or builds an Actor itself.
ACTOR_MODULES = frozenset({"core.actors", "tenants.actors"})
ACTOR_PREFIXES = ("user:", "api-key:", "system:", "cli:", "agent-saga:")
# Strings that begin as an actor does but are not one, each with why.
NOT_ACTORS: dict[tuple[str, str], str] = {
    ("approvals.actions.external", "agent-saga:"): "the policy key agent-saga's requests are bound to",
}


def test_the_prefixes_are_those_core_actors_renders() -> None:
    from core.actors import Actor, ActorKind

    rendered = {str(Actor(kind, "ID")).split("ID")[0] for kind in ActorKind}
    assert rendered - {""} == set(ACTOR_PREFIXES)


def actors_built_elsewhere() -> list[str]:
    found = []
    for module, path in _server_modules():
        if module in ACTOR_MODULES:
            continue
        tree = _tree(path)
        found += [
            f"{_where(path, line)} {value[:40]!r}"
            for line, value in _strings(tree)
            for prefix in ACTOR_PREFIXES
            if value.startswith(prefix) and (module, prefix) not in NOT_ACTORS
        ]
        found += [
            f"{_where(path, node.lineno)} {_name(node.func)}(...)"
            for node in ast.walk(tree)
            if isinstance(node, ast.Call) and _name(node.func) == "Actor"
        ]
    return found


def test_actors_are_built_in_one_place() -> None:
    assert actors_built_elsewhere() == [], "build actors with tenants/actors.py, read them with core.actors"


def test_the_strings_that_are_not_actors_are_still_there() -> None:
    modules = dict(_server_modules())
    stale = [
        key
        for key in NOT_ACTORS
        if key[0] not in modules
        or not any(value.startswith(key[1]) for _, value in _strings(_tree(modules[key[0]])))
    ]
    assert stale == [], "delete these NOT_ACTORS entries"


def test_an_actor_built_by_hand_is_reported(tree: Path) -> None:
    _write(tree, "core/actors.py", 'USER = "user:"\n')
    _write(
        tree,
        "fleet/halts.py",
        "from core.actors import Actor, ActorKind\n"
        'def who(name):\n    return f"user:{name}"\n'
        "def kind(s):\n    return s.startswith('api-key:')\n"
        "def made():\n    return Actor(ActorKind.SYSTEM, 'x')\n"
        'def fine():\n    """user: a docstring says so"""\n    return "username:"\n',
    )
    assert actors_built_elsewhere() == [
        "fleet/halts.py:3 'user:'",
        "fleet/halts.py:5 'api-key:'",
        "fleet/halts.py:7 Actor(...)",
    ]


# -- record kinds ------------------------------------------------------------------------------
# The record kinds are sagaplane.events.Event (the SDK's, imported by the server); a literal with
# a kind's value, in the server or elsewhere in the SDK, would let a renamed kind drift.
EVENTS_MODULE = Path("sdk/sagaplane/events.py")
# Literals that spell a kind's name but are no record kind, each with why.
NOT_EVENTS: dict[tuple[str, str], str] = {
    ("sdk/sagaplane/steps.py", "COMPENSATED"): "StepState's value: a step's state, not a record kind",
    ("sdk/sagaplane/steps.py", "COMPENSATION_FAILED"): "StepState's value: a step's state, not a record kind",
}


def event_values() -> frozenset[str]:
    return frozenset(
        statement.value.value
        for node in ast.walk(_tree(ROOT / EVENTS_MODULE))
        if isinstance(node, ast.ClassDef) and node.name == "Event"
        for statement in node.body
        if isinstance(statement, ast.Assign)
        and isinstance(statement.value, ast.Constant)
        and isinstance(statement.value.value, str)
    )


def events_as_literals() -> list[str]:
    values = event_values()
    sdk = sorted((ROOT / EVENTS_MODULE).parent.rglob("*.py"))
    return [
        f"{_where(path, line)} {value}"
        for path in [path for _, path in _server_modules()] + sdk
        if path != ROOT / EVENTS_MODULE
        for line, value in _strings(_tree(path))
        if value in values and (str(path.relative_to(ROOT)), value) not in NOT_EVENTS
    ]


def test_the_enum_is_read() -> None:
    assert {"SAGA_START", "APPROVAL_GRANTED", "SLACK_USER_LINKED"} <= event_values()


def test_record_kinds_are_named_by_the_enum() -> None:
    assert events_as_literals() == [], "name the record kind as sagaplane.events.Event.<KIND>"


def test_the_literals_that_are_no_record_kind_are_still_there() -> None:
    stale = [key for key in NOT_EVENTS if key[1] not in {v for _, v in _strings(_tree(ROOT / key[0]))}]
    assert stale == [], "delete these NOT_EVENTS entries"


def test_a_record_kind_as_a_literal_is_reported(tree: Path) -> None:
    _write(
        tree, str(EVENTS_MODULE), 'import enum\nclass Event(str, enum.Enum):\n    SAGA_START = "SAGA_START"\n'
    )
    _write(
        tree,
        "sagas/kinds.py",
        'START = "SAGA_START"\n'
        'def f():\n    """SAGA_START: a docstring may name it."""\n'
        '    return "SAGA_STARTED", "a SAGA_START"\n',
    )
    _write(tree, "sdk/sagaplane/wal.py", 'def f(event):\n    return event == "SAGA_START"\n')
    assert events_as_literals() == ["sagas/kinds.py:1 SAGA_START", "sdk/sagaplane/wal.py:2 SAGA_START"]


# -- leased-work claims --------------------------------------------------------------------------
# A claim raises the row's fencing token (core.claims.claim, declared per model by a `Leased`);
# raising a token by hand (`F("epoch") + 1` in an update, or SQL doing so) is a second claim.
CLAIMS_MODULE = "core.claims"


def fencing_tokens() -> frozenset[str]:
    """The token field of every `Leased(...)` the apps declare."""
    return frozenset(
        str(keyword.value.value)
        for _, path in _server_modules()
        for node in ast.walk(_tree(path))
        if isinstance(node, ast.Call) and _name(node.func) == "Leased"
        for keyword in node.keywords
        if keyword.arg == "token" and isinstance(keyword.value, ast.Constant)
    )


def _raises_a_token(node: ast.AST, tokens: frozenset[str]) -> bool:
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left = node.left
        return (
            isinstance(left, ast.Call)
            and _name(left.func) == "F"
            and bool(left.args)
            and isinstance(left.args[0], ast.Constant)
            and left.args[0].value in tokens
        )
    if (
        isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and re.search(r"\bUPDATE\b", node.value)
    ):
        return any(re.search(rf'\b{token}"?\s*\+', node.value) for token in tokens)
    return False


def claims_elsewhere() -> list[str]:
    tokens = fencing_tokens()
    return sorted(
        _where(path, node.lineno)
        for module, path in _server_modules()
        if module != CLAIMS_MODULE
        for node in ast.walk(_tree(path))
        if isinstance(node, ast.BinOp | ast.Constant) and _raises_a_token(node, tokens)
    )


def test_the_leased_models_are_found() -> None:
    # recovery's jobs, reconciliation's checks, Slack's messages, gate leases' settlement, exports
    assert {"epoch", "token", "settle_token", "attempts"} <= fencing_tokens()


def test_leased_work_is_claimed_by_core_claims() -> None:
    assert claims_elsewhere() == [], "claim with core.claims.claim; write as the holder with Leased.held"


def test_a_claim_by_hand_is_reported(tree: Path) -> None:
    _write(tree, "core/claims.py", "class Leased: ...\n")
    _write(
        tree, "slackapp/messages.py", 'from core.claims import Leased\nM = Leased(object, token="token")\n'
    )
    _write(
        tree,
        "slackapp/again.py",
        "from django.db.models import F\n"
        "def take(rows):\n"
        '    rows.update(token=F("token") + 1, version=F("version") + 1)\n'
        'SQL = \'UPDATE slackapp_message SET "token" = "token" + 1 WHERE id = %s\'\n',
    )
    assert claims_elsewhere() == ["slackapp/again.py:3", "slackapp/again.py:4"]


# -- per-tenant snapshot caches -------------------------------------------------------------------
# What a tenant's hot path reads is cached per process by core.snapshots.SnapshotCache (kept
# under the tenant's epoch). No other module keeps a cache of its own: a functools cache, a
# cachetools one, or a module-level dict that its functions fill. Those that are not caches of a
# tenant's data, each with why:
SNAPSHOTS_MODULE = "core.snapshots"
NOT_SNAPSHOTS: dict[str, str] = {
    "approvals.wake._heard": "wake-ups heard on the Redis channel, counted for the waiters",
    "core.metrics._queues": "a registry filled at import",
    "core.metrics._sources": "a registry filled at import",
    "core.rls._functions": "the cross-tenant functions, declared at import",
    "core.sql.is_postgres": "the database's vendor, fixed by the settings for the process' life",
    "recovery.actions.takeover._takeover_looked": "when a claim last looked for a tenant's expired leases",
    "tenants.authentication._held": (
        "API keys by prefix, found before their tenant is known; reused while the tenant's epoch holds"
    ),
    "transparency.lean._proofs": "the proofs' route table, built once",
    "transparency.proofs._latest_size_seen": "a guess at each log's size, checked by the proof's statement",
}
_CACHE_DECORATORS = frozenset({"cache", "lru_cache"})
_DICTS = frozenset({"dict", "OrderedDict", "defaultdict"})
_MUTATORS = frozenset({"setdefault", "update", "pop", "popitem", "clear", "move_to_end"})


def _module_dicts(tree: ast.Module) -> dict[str, int]:
    """name -> line of each module-level name bound to a dict."""
    found = {}
    for statement in tree.body:
        target: ast.expr
        if isinstance(statement, ast.AnnAssign) and statement.value is not None:
            target, value = statement.target, statement.value
        elif isinstance(statement, ast.Assign) and len(statement.targets) == 1:
            target, value = statement.targets[0], statement.value
        else:
            continue
        is_dict = isinstance(value, ast.Dict | ast.DictComp) or (
            isinstance(value, ast.Call) and _name(value.func) in _DICTS
        )
        if isinstance(target, ast.Name) and is_dict:
            found[target.id] = statement.lineno
    return found


def _filled(tree: ast.Module, names: dict[str, int]) -> set[str]:
    """Which of `names` a function of `tree` changes (an item set or deleted, a mutating method)."""
    changed: set[str] = set()
    for function in ast.walk(tree):
        if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in ast.walk(function):
            changed_values: list[ast.expr] = []  # what is changed: `d` of `d[k] = v` or `d.pop(k)`
            if isinstance(node, ast.Assign | ast.Delete | ast.AugAssign):
                targets = [node.target] if isinstance(node, ast.AugAssign) else node.targets
                changed_values = [t.value for t in targets if isinstance(t, ast.Subscript)]
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in _MUTATORS
            ):
                changed_values = [node.func.value]
            changed |= {v.id for v in changed_values if isinstance(v, ast.Name) and v.id in names}
    return changed


def caches_of_their_own() -> dict[str, str]:
    """module.name -> where, for each cache kept outside core.snapshots."""
    found: dict[str, str] = {}
    for module, path in _server_modules():
        if module == SNAPSHOTS_MODULE:
            continue
        tree = _tree(path)
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                for decorator in node.decorator_list:
                    called = decorator.func if isinstance(decorator, ast.Call) else decorator
                    if _name(called) in _CACHE_DECORATORS:
                        found[f"{module}.{node.name}"] = _where(path, node.lineno)
            elif isinstance(node, ast.Import | ast.ImportFrom):
                named = (
                    [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
                )
                if any(name.split(".")[0] == "cachetools" for name in named):
                    found[f"{module}.cachetools"] = _where(path, node.lineno)
        dicts = _module_dicts(tree)
        found |= {f"{module}.{name}": _where(path, dicts[name]) for name in _filled(tree, dicts)}
    return found


def test_tenants_data_is_cached_by_core_snapshots() -> None:
    new = {name: where for name, where in caches_of_their_own().items() if name not in NOT_SNAPSHOTS}
    assert new == {}, "cache what a tenant's hot path reads with core.snapshots.SnapshotCache"


def test_the_caches_that_are_not_snapshots_are_still_there() -> None:
    gone = sorted(set(NOT_SNAPSHOTS) - set(caches_of_their_own()))
    assert gone == [], "delete these NOT_SNAPSHOTS entries"


def test_a_cache_of_its_own_is_reported(tree: Path) -> None:
    _write(
        tree,
        "fleet/policies.py",
        "import functools\nfrom functools import lru_cache\nimport cachetools\n"
        "_by_tenant: dict[int, list] = {}\n"
        "_constant = {'a': 1}\n"
        "@functools.cache\ndef one(): ...\n"
        "@lru_cache(maxsize=8)\ndef two(): ...\n"
        "def read(tenant):\n    _by_tenant.setdefault(tenant, [])\n    return _constant['a']\n",
    )
    _write(tree, "core/snapshots.py", "import functools\n@functools.cache\ndef fine(): ...\n")
    assert caches_of_their_own() == {
        "fleet.policies.cachetools": "fleet/policies.py:3",
        "fleet.policies.one": "fleet/policies.py:7",
        "fleet.policies.two": "fleet/policies.py:9",
        "fleet.policies._by_tenant": "fleet/policies.py:4",
    }


# -- tests -----------------------------------------------------------------------------------------
# What tests share is in tests/support/ (or, for one app's tests, a non-test module beside them:
# tests/fleet/stores.py, tests/e2e/browser.py); no module imports a test module (running one file
# would collect, or break with, another), nor a conftest, its own directory's included: pytest
# loads a conftest as a plugin, its fixtures are requested by name, and what else it held is
# shared from a module of its own. Waiting is tests.support.waiting.wait_until: a wait named as
# one elsewhere is built on it (docs/DESIGN-NOTES.md, "What tests share lives in tests/support/").
SCRIPTS = ("tests", "bench")
SUPPORT = Path("tests/support")
WAIT_NAMES = re.compile(r"_?(wait_until|wait_for\w*|eventually\w*|until)")


def _scripts() -> list[Path]:
    return [path for top in SCRIPTS for path in sorted((ROOT / top).rglob("*.py"))]


def _imported_names() -> Iterator[tuple[str, str]]:
    """(`where`, dotted name) for each name a module of the tests or benches imports."""
    for path in _scripts():
        package = path.relative_to(ROOT).parent.parts
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                module = [node.module] if node.module else []
                parent = package[: len(package) - node.level + 1] if node.level else ()
                names = [".".join([*parent, *module, alias.name]) for alias in node.names]
            else:
                continue
            yield from ((_where(path, node.lineno), name) for name in names)


def imports_of_test_modules() -> list[str]:
    """`where name` for each import of a test module (`test_*`) by a module of the tests or benches."""
    return [
        f"{where} {name}"
        for where, name in _imported_names()
        if any(part.startswith("test_") for part in name.split(".")[1:])
    ]


def imports_of_conftests() -> list[str]:
    """`where name` for each import of a conftest (any directory's, the importer's own included)."""
    return [f"{where} {name}" for where, name in _imported_names() if "conftest" in name.split(".")]


def waits_of_their_own() -> list[str]:
    """`where name` for each function named as a wait, outside tests/support, not using wait_until."""
    return [
        f"{_where(path, node.lineno)} {node.name}"
        for path in _scripts()
        if not path.relative_to(ROOT).is_relative_to(SUPPORT)
        for node in ast.walk(_tree(path))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and WAIT_NAMES.fullmatch(node.name)
        and not any(isinstance(c, ast.Call) and _name(c.func) == "wait_until" for c in ast.walk(node))
    ]


# A loop in a test that sleeps is a wait of its own, whatever its name: poll with wait_until (or
# wait_until_async in a coroutine). Allowed: (path, function) of loops that wait for no condition.
SLEEPING_LOOPS = {
    ("tests/fleet/lease_worker.py", "agent"),  # an agent's own spending loop, pausing after an error
}


def _sleeping_loops(node: ast.AST, function: str) -> Iterator[tuple[int, str]]:
    """(line, enclosing function) of each loop under `node` that calls a `sleep`."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
            yield from _sleeping_loops(child, child.name)
        elif isinstance(child, ast.While | ast.For | ast.AsyncFor) and any(
            isinstance(c, ast.Call) and _name(c.func) == "sleep" for c in ast.walk(child)
        ):
            yield child.lineno, function
        else:
            yield from _sleeping_loops(child, function)


def polls_of_their_own() -> list[str]:
    """`where function` for each loop that sleeps in a module of the tests outside tests/support."""
    return [
        f"{_where(path, line)} {function}"
        for path in sorted((ROOT / "tests").rglob("*.py"))
        if not path.relative_to(ROOT).is_relative_to(SUPPORT)
        for line, function in _sleeping_loops(_tree(path), "")
        if (str(path.relative_to(ROOT)), function) not in SLEEPING_LOOPS
    ]


# A coroutine's database work goes to a worker thread through tests.support.threads.in_thread,
# which closes the thread's connection: left open, it holds a pooled connection for the rest of
# the process.
HANDOFFS = ("to_thread", "run_sync", "run_in_executor")


def handoffs_of_their_own() -> list[str]:
    """`where function` for each hand-off to a worker thread in the tests outside tests/support."""
    found = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        relative = path.relative_to(ROOT)
        if relative.is_relative_to(SUPPORT):
            continue
        for function, call in _calls_by_function(_tree(path), ""):
            if _name(call.func) in HANDOFFS:
                found.append(f"{_where(path, call.lineno)} {function}")
    return found


def _calls_by_function(node: ast.AST, function: str) -> Iterator[tuple[str, ast.Call]]:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
            yield from _calls_by_function(child, child.name)
            continue
        if isinstance(child, ast.Call):
            yield function, child
        yield from _calls_by_function(child, function)


def test_no_module_imports_a_test_module() -> None:
    assert imports_of_test_modules() == [], (
        "share it from tests/support/ or a non-test module beside the tests"
    )


def test_no_module_imports_a_conftest() -> None:
    assert imports_of_conftests() == [], (
        "request a fixture by name; share a helper from tests/support/ or a non-test module beside the tests"
    )


def test_waiting_is_the_one_wait_until() -> None:
    assert waits_of_their_own() == [], "wait with tests.support.waiting.wait_until"


def test_database_work_goes_to_a_thread_through_in_thread() -> None:
    assert handoffs_of_their_own() == [], "hand work to a thread with tests.support.threads.in_thread"


def test_a_hand_off_to_a_thread_is_reported_but_in_tests_support(tree: Path) -> None:
    in_thread = "import anyio\nasync def in_thread(f):\n    await anyio.to_thread.run_sync(f)\n"
    _write(tree, "tests/support/threads.py", in_thread)
    _write(
        tree,
        "tests/fleet/test_a.py",
        "import asyncio, anyio\nasync def test_a(client):\n    await asyncio.to_thread(client.get, '/')\n"
        "async def test_b(loop):\n    await loop.run_in_executor(None, print)\n"
        "async def test_c():\n    await anyio.to_thread.run_sync(print)\n",
    )
    assert handoffs_of_their_own() == [
        "tests/fleet/test_a.py:3 test_a",
        "tests/fleet/test_a.py:5 test_b",
        "tests/fleet/test_a.py:7 test_c",
    ]


def test_no_test_polls_with_a_loop_of_its_own() -> None:
    assert polls_of_their_own() == [], "poll with tests.support.waiting.wait_until or wait_until_async"


def test_a_test_module_or_a_conftest_imported_and_a_wait_of_its_own_are_reported(tree: Path) -> None:
    _write(tree, "tests/support/waiting.py", "def wait_until(condition, what): ...\n")
    _write(tree, "tests/fleet/helpers.py", "def wait_for(ok):\n    while not ok():\n        pass\n")
    _write(
        tree,
        "tests/fleet/test_b.py",
        "from tests.fleet import test_a\nfrom tests.fleet.test_a import store\nimport tests.fleet.test_a\n"
        "from .test_a import store as again\nfrom tests.fleet.helpers import wait_for\n"
        "from tests.support.waiting import wait_until\n"
        "def _until(ok):\n    return wait_until(ok, 'ok')\n"
        "from tests.fleet.conftest import here\nfrom .conftest import near\nfrom tests.conftest import root\n"
        "from tests.approvals.conftest import agent\nfrom tests.approvals import conftest\n"
        "import tests.e2e.conftest\nfrom tests.support.conftests import fine\n",
    )
    assert imports_of_test_modules() == [
        "tests/fleet/test_b.py:1 tests.fleet.test_a",
        "tests/fleet/test_b.py:2 tests.fleet.test_a.store",
        "tests/fleet/test_b.py:3 tests.fleet.test_a",
        "tests/fleet/test_b.py:4 tests.fleet.test_a.store",
    ]
    assert imports_of_conftests() == [
        "tests/fleet/test_b.py:9 tests.fleet.conftest.here",
        "tests/fleet/test_b.py:10 tests.fleet.conftest.near",
        "tests/fleet/test_b.py:11 tests.conftest.root",
        "tests/fleet/test_b.py:12 tests.approvals.conftest.agent",
        "tests/fleet/test_b.py:13 tests.approvals.conftest",
        "tests/fleet/test_b.py:14 tests.e2e.conftest",
    ]
    assert waits_of_their_own() == ["tests/fleet/helpers.py:1 wait_for"]


def test_a_loop_that_sleeps_is_reported_but_in_tests_support_and_where_allowed(tree: Path) -> None:
    sleeps = "import time\ndef wait_until(ok):\n    while not ok():\n        time.sleep(1)\n"
    _write(tree, "tests/support/waiting.py", sleeps)
    _write(tree, "bench/fleet.py", sleeps)
    _write(
        tree,
        "tests/fleet/lease_worker.py",
        "import time\ndef main():\n    def agent():\n        while True:\n            time.sleep(1)\n",
    )
    _write(
        tree,
        "tests/fleet/test_a.py",
        "import anyio, time\n"
        "async def test_a(ok):\n    while not ok():\n        await anyio.sleep(1)\n"
        "def test_b(ok):\n    for _ in range(9):\n        if ok():\n            break\n"
        "        time.sleep(1)\n"
        "    def once():\n        while not ok():\n            sleep(1)\n"
        "def test_c(ok):\n    while not ok():\n        pass\n    time.sleep(1)\n",
    )
    assert polls_of_their_own() == [
        "tests/fleet/test_a.py:3 test_a",
        "tests/fleet/test_a.py:6 test_b",
        "tests/fleet/test_a.py:11 once",
    ]
