"""Step semantics, compensations and the named-compensator registry."""

from __future__ import annotations

import enum
import hashlib
import inspect
import json
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .credentials import recorded


class Semantics(str, enum.Enum):  # noqa: UP042 (json and str() give the value)
    """How far the world can be put back. The string values are what the WAL records."""

    PREVIEW = "PREVIEW"  # no effect at all (a dry run / a read); never compensated
    REVERSIBLE = "REVERSIBLE"  # exact undo; cheap path, no fsync before the effect
    COMPENSABLE = "COMPENSABLE"  # can be offset but leaves a trace; intent is fsynced first
    IRREVERSIBLE = "IRREVERSIBLE"  # nothing undoes it; needs an explicit confirmation


PREVIEW = Semantics.PREVIEW
REVERSIBLE = Semantics.REVERSIBLE
COMPENSABLE = Semantics.COMPENSABLE
IRREVERSIBLE = Semantics.IRREVERSIBLE

_HANDLERS: dict[str, Callable[..., Any]] = {}


def compensator(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register a compensation under a stable name so another process can run it after a crash.

    The name, not the function, goes into the WAL; a recovery worker resolves it here.
    """

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        existing = _HANDLERS.get(name)
        if existing is not None and existing is not fn and _qualname(existing) != _qualname(fn):
            raise ValueError(f"compensator {name!r} is already registered to {_qualname(existing)}")
        _HANDLERS[name] = fn
        fn.__sagaplane_compensator__ = name  # type: ignore[attr-defined]
        return fn

    return decorate


def resolve_compensator(name: str) -> Callable[..., Any] | None:
    return _HANDLERS.get(name)


def registered_compensators() -> tuple[str, ...]:
    return tuple(sorted(_HANDLERS))


def _qualname(fn: Callable[..., Any]) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def _plain_json(value: Any, depth: int = 0) -> bool:
    """True for values built only from exact dict (str keys) / list / str / int / bool / None /
    finite float: those survive a JSON round trip unchanged, no encoding needed to know it."""
    t = type(value)
    if t is str or t is int or t is bool or value is None:
        return True
    if t is float:
        return value == value and value not in (float("inf"), float("-inf"))
    if depth > 32:
        return False
    if t is list:
        return all(_plain_json(v, depth + 1) for v in value)
    if t is dict:
        return all(type(k) is str and _plain_json(v, depth + 1) for k, v in value.items())
    return False


def json_roundtrips(value: Any) -> bool:
    if _plain_json(value):
        return True
    try:
        return bool(json.loads(json.dumps(value)) == value)
    except (TypeError, ValueError):
        return False


def idempotency_key(saga_id: str, step_id: str, scope: str = "compensate") -> str:
    """Deterministic, so a recovery worker in another process derives the same key."""
    return hashlib.sha256(f"{saga_id}:{step_id}:{scope}".encode()).hexdigest()


_ACCEPTS: dict[tuple[Any, str], bool] = {}
_ACCEPTS_MAX = 4096


def accepts_kwarg(fn: Callable[..., Any], name: str) -> bool:
    # Plain functions are cached by code object: every closure made by one `def` or `lambda`
    # shares it, and parameter names and kinds come from it alone (bounded, never per call).
    key = None
    if (
        type(fn) is types.FunctionType
        and "__wrapped__" not in fn.__dict__
        and "__signature__" not in fn.__dict__
    ):
        key = (fn.__code__, name)
        cached = _ACCEPTS.get(key)
        if cached is not None:
            return cached
    result = _accepts_kwarg(fn, name)
    if key is not None and len(_ACCEPTS) < _ACCEPTS_MAX:
        _ACCEPTS[key] = result
    return result


def _accepts_kwarg(fn: Callable[..., Any], name: str) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


@dataclass
class Compensation:
    """A concrete inverse, derived from the forward call's result.

    `handler` names a registered compensator (recoverable across processes when its
    kwargs survive JSON); `fn` alone is an in-process closure and is logged as
    recoverable=false, because a crash makes it unrunnable.
    """

    fn: Callable[..., Any] | None = None
    kwargs: dict[str, Any] = field(default_factory=dict)
    handler: str | None = None
    description: str = ""

    def __post_init__(self) -> None:
        if self.fn is None and self.handler is None:
            raise ValueError("a Compensation needs a callable or a registered handler name")
        if self.handler is None and self.fn is not None:
            self.handler = getattr(self.fn, "__sagaplane_compensator__", None)

    @property
    def recoverable(self) -> bool:
        return (
            bool(self.handler)
            and resolve_compensator(self.handler or "") is not None
            and json_roundtrips(recorded(self.kwargs, markers=True))
        )

    def callable(self) -> Callable[..., Any]:
        fn = self.fn or resolve_compensator(self.handler or "")
        if fn is None:
            raise LookupError(f"no compensator registered under {self.handler!r}")
        return fn

    def describe(self, idem_key: str) -> dict[str, Any]:
        """The WAL form (agent-saga's descriptor): enough for another process to run it."""
        recoverable = self.recoverable
        fn = self.fn or resolve_compensator(self.handler or "")
        return {
            "fn": getattr(fn, "__qualname__", None) or self.handler or repr(fn),
            "handler": self.handler,
            "recoverable": recoverable,
            "description": self.description,
            "idempotency_key": idem_key,
            "kwargs": recorded(self.kwargs, markers=True) if recoverable else json_safe(self.kwargs),
        }


def undo(handler: str, /, description: str = "", **kwargs: Any) -> Compensation:
    """Shorthand for a named compensation: `compensate=lambda r: sp.undo("stripe.refund", charge=r.id)`."""
    return Compensation(handler=handler, kwargs=kwargs, description=description)


def json_safe(value: Any, _depth: int = 0) -> Any:
    """Best-effort JSON projection used on the logging path; never raises."""
    if _depth > 20:
        return repr(value)[:512]
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        # NaN/inf are not JSON; a server would reject the whole batch over one value.
        return value if value == value and value not in (float("inf"), float("-inf")) else repr(value)
    if isinstance(value, enum.Enum):
        return json_safe(value.value, _depth + 1)
    if isinstance(value, (list, tuple)):
        return [json_safe(v, _depth + 1) for v in value]
    if isinstance(value, dict):
        return {str(k): json_safe(v, _depth + 1) for k, v in value.items()}
    return repr(value)[:512]


def import_handler_modules(spec: str) -> None:
    """Import each module of a comma-separated `spec` (the current folder first on the path, so
    `myapp.compensators` works from the project's folder): their @compensator and @reconciler
    functions register on import. An ImportError names the module that failed."""
    import importlib
    import os
    import sys

    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    for module in filter(None, (m.strip() for m in spec.split(","))):
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise ImportError(f"cannot import {module}: {exc}") from exc
