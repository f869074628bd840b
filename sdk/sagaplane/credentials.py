"""Credential references: `sp.secret("ref")` in a tool's arguments is resolved when the call is
made, by the resolver the agent configured (`sp.configure(secret_resolver=...)`; by default the
environment, `EnvSecrets`), and recorded everywhere else only as the reference.

- In the process, a reference is a `Secret` (its `ref` only: it never holds the value).
- In a record (the WAL, and so what is shipped, shown and exported) it is `{"$secret": "<ref>"}`.
- The value exists only in the arguments the tool (or a compensator) is called with, and for the
  saga's life in its scrubber: an error message that quotes the value is recorded with
  `<secret:ref>` in its place.

A compensation's arguments may hold references too (`sp.undo("x.revoke", key=sp.secret("k"))`,
or the step's own arguments handed to a compensation factory); they are recorded as references
and resolved when the compensation runs, in this process or in a recovery worker. A forward call's
arguments may not hold a literal `{"$secret": ...}` object (`SecretError`): only `sp.secret()`
makes a reference, so a value that came from a model cannot name a credential for a later call.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from typing import Any

MARKER = "$secret"
REF_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,199}$")
ENV_PREFIX = "SAGAPLANE_SECRET_"

Resolver = Callable[[str], Any]
_SCALARS = (str, int, float, bool, type(None), bytes)


class SecretError(ValueError):
    """A reference that is not one: a bad name, or a literal `{"$secret": ...}` in a call's arguments."""


class SecretUnresolved(LookupError):
    """The resolver has no value for this reference: the call was not made (recorded not applied)."""

    def __init__(self, ref: str, why: str = "") -> None:
        self.ref = ref
        super().__init__(f"secret {ref!r} could not be resolved" + (f": {why}" if why else ""))


class Secret:
    """A reference to a credential. Holds the name only; `repr` and `str` show the name."""

    __slots__ = ("ref",)

    def __init__(self, ref: str) -> None:
        if not isinstance(ref, str) or not REF_RE.match(ref):
            raise SecretError(f"a secret reference is 1-200 of A-Z a-z 0-9 . _ : / - (not {ref!r})")
        self.ref = ref

    def __repr__(self) -> str:
        return f"sp.secret({self.ref!r})"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other.ref == self.ref

    def __hash__(self) -> int:
        return hash((Secret, self.ref))

    def reference(self) -> dict[str, str]:
        return {MARKER: self.ref}


def secret(ref: str) -> Secret:
    """A credential reference for a tool's arguments: `charge(api_key=sp.secret("stripe"))`."""
    return Secret(ref)


class EnvSecrets:
    """The built-in resolver: reference `stripe.live` reads `SAGAPLANE_SECRET_STRIPE_LIVE` (the
    prefix, then the reference upper-cased with every other character than A-Z 0-9 as `_`). Only
    variables with the prefix can be named, so a reference cannot read the agent's other settings."""

    def __init__(self, prefix: str = ENV_PREFIX, environ: Mapping[str, str] | None = None) -> None:
        self.prefix = prefix
        self.environ = environ

    def variable(self, ref: str) -> str:
        return self.prefix + re.sub(r"[^A-Za-z0-9]", "_", ref).upper()

    def __call__(self, ref: str) -> str:
        name = self.variable(ref)
        value = (os.environ if self.environ is None else self.environ).get(name)
        if value is None:
            raise SecretUnresolved(ref, f"{name} is not set")
        return value


_resolver: list[Resolver] = [EnvSecrets()]


def set_resolver(resolver: Resolver | None) -> None:
    """The process's resolver (`sp.configure(secret_resolver=...)`); None: `EnvSecrets()`."""
    _resolver[0] = resolver if resolver is not None else EnvSecrets()


def get_resolver() -> Resolver:
    return _resolver[0]


def _is_marker(value: dict[Any, Any]) -> bool:
    return len(value) == 1 and MARKER in value and isinstance(value[MARKER], str)


def recorded(value: Any, *, markers: bool = False) -> Any:
    """`value` as it is recorded: every `Secret` replaced by its reference object. The same object
    when it holds none (the common case costs one walk and no copy: this runs on every step). A
    literal reference object is refused (SecretError) unless `markers` (a compensation's arguments,
    which may carry the step's)."""
    kind = type(value)
    if kind in _SCALARS:
        return value
    if kind is Secret:
        return value.reference()
    if isinstance(value, dict):
        if not markers and MARKER in value and _is_marker(value):
            raise SecretError(
                f"a literal {{{MARKER!r}: ...}} in the arguments; only sp.secret() makes a reference"
            )
        out: dict[Any, Any] | None = None
        for key, item in value.items():
            if type(item) in _SCALARS:
                continue
            new = recorded(item, markers=markers)
            if new is not item:
                out = dict(value) if out is None else out
                out[key] = new
        return value if out is None else out
    if isinstance(value, list | tuple):
        items: list[Any] | None = None
        for i, item in enumerate(value):
            if type(item) in _SCALARS:
                continue
            new = recorded(item, markers=markers)
            if new is not item:
                items = list(value) if items is None else items
                items[i] = new
        if items is None:
            return value
        return items if isinstance(value, list) else tuple(items)
    return value


class Resolved:
    """The values resolved for one saga, to scrub them out of what it records (error messages)."""

    def __init__(self) -> None:
        self.values: dict[str, str] = {}  # the value's text -> its reference

    def resolve(self, value: Any, *, markers: bool = False) -> Any:
        """`value` with each `Secret` (and, with `markers`, each reference object) replaced by what
        the resolver gives now. The same object when it holds none. Raises SecretUnresolved."""
        kind = type(value)
        if kind in _SCALARS:
            return value
        if kind is Secret:
            return self._one(value.ref)
        if isinstance(value, dict):
            if markers and _is_marker(value):
                return self._one(value[MARKER])
            out: dict[Any, Any] | None = None
            for key, item in value.items():
                new = self.resolve(item, markers=markers)
                if new is not item:
                    out = dict(value) if out is None else out
                    out[key] = new
            return value if out is None else out
        if isinstance(value, list | tuple):
            items = [self.resolve(item, markers=markers) for item in value]
            changed = any(new is not old for new, old in zip(items, value, strict=True))
            return (items if isinstance(value, list) else tuple(items)) if changed else value
        return value

    def _one(self, ref: str) -> Any:
        try:
            value = get_resolver()(ref)
        except SecretUnresolved:
            raise
        except Exception as exc:  # the resolver's own failure names its type only: it may quote a value
            raise SecretUnresolved(ref, f"the resolver raised {type(exc).__name__}") from None
        if value is None:
            raise SecretUnresolved(ref, "the resolver returned None")
        text = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
        if text:
            self.values[text] = ref
        return value

    def scrub(self, text: str) -> str:
        """`text` with every resolved value (and its repr-escaped form) replaced by `<secret:ref>`."""
        for value, ref in self.values.items():
            if value in text:
                text = text.replace(value, f"<secret:{ref}>")
            quoted = repr(value)[1:-1]
            if quoted != value and quoted in text:
                text = text.replace(quoted, f"<secret:{ref}>")
        return text


__all__ = [
    "EnvSecrets",
    "Resolved",
    "Secret",
    "SecretError",
    "SecretUnresolved",
    "get_resolver",
    "recorded",
    "secret",
    "set_resolver",
]
