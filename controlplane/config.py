"""Reading settings from the environment, strictly: every variable is checked when the process
starts, in every mode, and every problem is reported at once, naming the variable and what it
must be. A value that is not understood is refused, never read as a default
(`SAGAPLANE_ENV=Production` used to mean development; a malformed master key used to pass
`check` and break the first integration).

Values that may hold credentials (keys, URLs with passwords) are never echoed in a message.
"""

from __future__ import annotations

import importlib.util
import ipaddress
import re
from collections.abc import Mapping, Sequence
from email.utils import parseaddr
from pathlib import Path
from urllib.parse import urlsplit

from django.core.exceptions import ImproperlyConfigured

TRUE = ("true", "1", "yes", "on")
FALSE = ("false", "0", "no", "off")
_DOTTED_PATH = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+$")


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


class ConfigurationError(ImproperlyConfigured):
    """The environment does not configure a process that may start; the message lists why."""


class Config:
    """One reader per settings module: each accessor returns a usable value (the default when the
    variable is malformed, so reading can go on) and records the problem; `finish` refuses to
    start when there is any."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self.environ = environ
        self.problems: list[str] = []

    def __contains__(self, name: str) -> bool:
        return name in self.environ

    def refuse(self, name: str, must: str, value: str | None = None, *, secret: bool = False) -> None:
        got = "" if value is None or secret else f" (got {value!r})"
        self.problems.append(f"{name} must be {must}{got}")

    # -- scalars ---------------------------------------------------------------------------------

    def text(self, name: str, default: str, *, pattern: re.Pattern[str] | None = None, must: str = "") -> str:
        value = self.environ.get(name, default)
        if pattern is not None and not pattern.fullmatch(value):
            self.refuse(name, must, value)
            return default
        return value

    def choice(self, name: str, choices: Sequence[str], default: str) -> str:
        value = self.environ.get(name, default)
        if value not in choices:
            self.refuse(name, "one of " + ", ".join(choices), value)
            return default
        return value

    def boolean(self, name: str, default: bool) -> bool:
        value = self.environ.get(name)
        if value is None:
            return default
        if value.strip().lower() in TRUE:
            return True
        if value.strip().lower() in FALSE:
            return False
        self.refuse(name, "true or false (also 1/0, yes/no, on/off)", value)
        return default

    def integer(self, name: str, default: int, *, minimum: int, maximum: int | None = None) -> int:
        value = self.environ.get(name)
        if value is None:
            return default
        bounds = f"at least {minimum}" if maximum is None else f"from {minimum} to {maximum}"
        try:
            number = int(value.strip())
        except ValueError:
            self.refuse(name, f"a whole number {bounds}", value)
            return default
        if number < minimum or (maximum is not None and number > maximum):
            self.refuse(name, f"a whole number {bounds}", value)
            return default
        return number

    def seconds(self, name: str, default: float, *, maximum: float) -> float:
        value = self.environ.get(name)
        if value is None:
            return default
        try:
            number = float(value.strip())
        except ValueError:
            number = float("nan")
        if not 0 < number <= maximum:  # also refuses nan
            self.refuse(name, f"a number of seconds above 0 and at most {maximum:g}", value)
            return default
        return number

    # -- lists, paths, URLs -------------------------------------------------------------------------

    def items(self, name: str, default: list[str]) -> list[str]:
        """A comma-separated list; empty items (a stray comma) are refused, not skipped."""
        value = self.environ.get(name)
        if value is None:
            return list(default)
        parts = [part.strip() for part in value.split(",")]
        if value.strip() and any(not part for part in parts):
            self.refuse(name, "a comma-separated list without empty items", value)
            return [part for part in parts if part]
        return [part for part in parts if part]

    def hosts(self, name: str, default: list[str]) -> list[str]:
        hosts = self.items(name, default)
        for host in hosts:
            if "/" in host or any(ch.isspace() for ch in host):
                self.refuse(name, "host names such as sagaplane.example.com or .example.com", host)
        return hosts

    def origins(self, name: str, default: list[str]) -> list[str]:
        origins = self.items(name, default)
        for origin in origins:
            parts = urlsplit(origin)
            if parts.scheme not in ("http", "https") or not parts.netloc or parts.path not in ("", "/"):
                self.refuse(name, "origins such as https://sagaplane.example.com (scheme and host)", origin)
        return origins

    def directory(self, name: str, default: Path) -> Path:
        path = Path(self.environ.get(name, str(default))).resolve()
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            self.refuse(name, f"a folder this process can create and write ({exc.strerror})", str(path))
        return path

    def dotted_path(self, name: str, default: str, *, what: str) -> str:
        value = self.environ.get(name, default)
        module = value.rpartition(".")[0]
        try:
            found = bool(_DOTTED_PATH.fullmatch(value)) and importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            self.refuse(name, f"the dotted path of {what} in an installed module", value)
            return default
        return value

    def url(self, name: str, schemes: Sequence[str], default: str = "", *, needs_path: bool = False) -> str:
        """A URL with one of `schemes` and a host; its value is never echoed (it may hold a password)."""
        value = self.environ.get(name, default)
        if not value:
            return ""
        parts = urlsplit(value)
        if parts.scheme not in schemes:
            shown = f"; got scheme {parts.scheme!r}" if parts.scheme else ""
            self.refuse(
                name, "a URL starting " + " or ".join(f"{s}://" for s in schemes) + shown, secret=True
            )
            return ""
        if parts.scheme not in ("sqlite", "consolemail", "dummymail", "memorymail", "filemail"):
            try:
                port_ok = parts.port is None or parts.port > 0
            except ValueError:
                port_ok = False
            if not parts.hostname or not port_ok:
                self.refuse(
                    name, f"a {parts.scheme}:// URL with a host (and a valid port, if any)", secret=True
                )
                return ""
        if needs_path and not parts.path.strip("/"):
            self.refuse(name, f"a {parts.scheme}:// URL naming a database (…/name)", secret=True)
            return ""
        return value

    def database_owner_url(self, name: str, runtime_name: str, runtime_url: str) -> str:
        """The owner role's URL (runs migrations, owns the tables): a postgres:// URL of the same
        host, port and database as the runtime URL, with another role. Empty when not set."""
        value = self.url(name, ("postgres", "postgresql"), needs_path=True)
        if not value:
            return ""
        owner, runtime = urlsplit(value), urlsplit(runtime_url)
        if runtime.scheme not in ("postgres", "postgresql"):
            self.refuse(name, f"set only when {runtime_name} is a postgres:// URL", secret=True)
            return ""
        if (owner.hostname, owner.port, owner.path) != (runtime.hostname, runtime.port, runtime.path):
            self.refuse(name, f"a URL of the same host, port and database as {runtime_name}", secret=True)
            return ""
        if not owner.username or owner.username == runtime.username:
            self.refuse(
                name,
                f"a URL naming the owner role, another role than {runtime_name}'s "
                "(the role the application runs as must own no table)",
                secret=True,
            )
            return ""
        return value

    def redis_url(self, name: str) -> str:
        value = self.url(name, ("redis", "rediss"))
        database = urlsplit(value).path.strip("/") if value else ""
        if database and not (database.isascii() and database.isdigit()):
            self.refuse(name, "a redis:// URL whose path, if any, is a database number (/0)", secret=True)
            return ""
        return value

    def fernet_keys(self, name: str) -> list[str] | None:
        """Comma-separated Fernet keys, newest first; None when the variable is not set."""
        from cryptography.fernet import Fernet

        if name not in self.environ:
            return None
        keys = [key.strip() for key in self.environ[name].split(",")]
        must = (
            "one or more Fernet keys, comma-separated, newest first "
            "(each 32 url-safe base64 bytes, as Fernet.generate_key() makes)"
        )
        if not keys or any(not key for key in keys):
            self.refuse(name, must, secret=True)
            return None
        for position, key in enumerate(keys, start=1):
            try:
                Fernet(key)
            except (ValueError, TypeError):
                self.refuse(name, must + f"; key {position} of {len(keys)} is not one", secret=True)
                return None
        return keys

    def email_address(self, name: str, default: str) -> str:
        value = self.environ.get(name, default)
        if "@" not in parseaddr(value)[1]:
            self.refuse(
                name, "an e-mail address, optionally with a name: Sagaplane <no-reply@example.com>", value
            )
            return default
        return value

    # -- checks across variables ---------------------------------------------------------------------

    def relying_party(self, rp_id: str, origins: Sequence[str], allowed_hosts: Sequence[str]) -> list[str]:
        """Why passkeys could not work as production configures them ([] when they can): the RP id
        must be set and be a host name (never an address), and every origin set, https, on the RP
        id (the name or under it, as WebAuthn requires) and served by a host ALLOWED_HOSTS lets in
        (else every ceremony fails, or the RP id names a site this deployment is not)."""
        from django.http.request import validate_host

        rp, where = "SAGAPLANE_WEBAUTHN_RP_ID", "SAGAPLANE_WEBAUTHN_ORIGINS"
        if rp not in self.environ:
            return [f"{rp} is not set (passkeys would be bound to the default, localhost)"]
        problems = []
        if _is_address(rp_id):
            problems.append(f"{rp} is an IP address ({rp_id}); WebAuthn needs a host name")
        if not origins:
            problems.append(f"{where} is not set (the https:// origins the dashboard is served from)")
        for origin in origins:
            parts = urlsplit(origin)
            host = parts.hostname or ""
            if parts.scheme != "https":
                problems.append(f"{where}: {origin} is not an https:// origin")
            if host != rp_id and not host.endswith("." + rp_id):
                problems.append(f"{where}: {origin} is not on the relying party {rp} ({rp_id}) or under it")
            if not validate_host(host, list(allowed_hosts)):
                problems.append(f"{where}: {origin}'s host {host} is not one of ALLOWED_HOSTS")
        return problems

    # -- the verdict -------------------------------------------------------------------------------

    def finish(self, insecure: Sequence[str] = ()) -> None:
        """Refuse to start, listing everything at once: malformed values (every mode) and, in
        production, insecure defaults."""
        sections = []
        if self.problems:
            sections.append("Refusing to start: invalid configuration:\n- " + "\n- ".join(self.problems))
        if insecure:
            sections.append(
                "Refusing to start in production mode with insecure settings:\n- " + "\n- ".join(insecure)
            )
        if sections:
            raise ConfigurationError("\n".join(sections))
