"""The outbound-address guard: every request the control plane makes to a URL a tenant gave it
(recovery and reconciliation webhooks, witnesses) goes through `pinned_connection`.

A tenant's URL must not turn the control plane into a proxy into its own network: unless
`SAGAPLANE_WEBHOOK_ALLOW_PRIVATE` is on (development and the embedded demo), a URL whose host
resolves to any address that is not globally routable (loopback, private, link-local such as the
169.254.169.254 metadata service, shared, multicast, reserved, unspecified; IPv4-mapped IPv6
judged by its IPv4 address) is refused when it is configured (`check_url`) and again at each
request, after resolving the name once more: the connection then goes to exactly the address
that was vetted (no second lookup a rebinding DNS server could answer differently), and a
redirect is an answer, never followed."""

from __future__ import annotations

import http.client
import ipaddress
import socket
import ssl
import urllib.parse

# Indirections the tests replace (a rebinding name server, a connection that records its address).
_lookup = socket.getaddrinfo
_connect = socket.create_connection


class UnsafeAddress(OSError):
    """The webhook's host is (or resolves to) an address deliveries may not go to. An OSError,
    so a delivery refused for it is a failed attempt like an unreachable receiver."""


def allow_private() -> bool:
    from django.conf import settings

    return bool(getattr(settings, "SAGAPLANE_WEBHOOK_ALLOW_PRIVATE", False))


_IPv4 = ipaddress.IPv4Address
_IPv6 = ipaddress.IPv6Address
_NET = ipaddress.ip_network
# IPv6 ranges that carry an IPv4 address in their low 32 bits: a packet to one reaches (through a
# translator or the host's own stack) that IPv4 address, which is judged instead.
_CARRY_LOW_32 = (
    _NET("::ffff:0:0/96"),  # IPv4-mapped
    _NET("::ffff:0:0:0/96"),  # IPv4-translated (SIIT, RFC 2765)
    _NET("64:ff9b::/96"),  # NAT64, the well-known prefix (RFC 6052): how IPv6-only hosts reach IPv4
)
# Refused whatever they carry: transition mechanisms no webhook receiver needs, whose relays or
# translators would carry a delivery to an IPv4 address (or one we cannot locate) of their choosing.
_REFUSED_RANGES = (
    (_NET("2002::/16"), "6to4"),  # 2002:AABB:CCDD:: reaches AA.BB.CC.DD through a relay
    (_NET("2001::/32"), "Teredo"),  # server and (inverted) client IPv4 addresses inside
    (_NET("64:ff9b:1::/48"), "local-use NAT64"),  # RFC 8215: where the IPv4 sits is the operator's
    (_NET("::/96"), "IPv4-compatible"),  # deprecated (RFC 4291), ::a.b.c.d (:: and ::1 aside)
)


def forbidden(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str:
    """Why deliveries may not go to `address` ('' when they may): the one judgement of every
    address a webhook would connect to. An IPv6 address that carries an IPv4 one (mapped,
    translated, NAT64's well-known prefix, an ISATAP interface id) is judged by that IPv4 address
    as well; 6to4, Teredo, local-use NAT64 and IPv4-compatible addresses are refused outright."""
    if isinstance(address, _IPv6) and int(address) > 1:  # :: and ::1 are judged below
        for network, name in _REFUSED_RANGES:
            if address in network:
                carried = address.sixtofour or (address.teredo[1] if address.teredo else None)
                shown = f", carrying {carried}" if carried is not None else ""
                return f"{name}{shown}"
        if any(address in network for network in _CARRY_LOW_32):
            carried = _IPv4(int(address) & 0xFFFFFFFF)
            why = forbidden(carried)
            return f"{why}, carried as {carried}" if why else ""
        interface_id = int(address) & 0xFFFFFFFFFFFFFFFF
        if interface_id >> 32 in (0x00005EFE, 0x02005EFE):  # ISATAP: the IPv4 tunnel end point
            carried = _IPv4(interface_id & 0xFFFFFFFF)
            why = forbidden(carried)
            if why:
                return f"{why}, carried as {carried} (ISATAP)"
    for flag in ("unspecified", "loopback", "link_local", "private", "multicast", "reserved"):
        if getattr(address, f"is_{flag}"):
            return flag.replace("_", "-")
    if not address.is_global:
        return "not globally routable"
    return ""


def _target(url: str) -> tuple[str, str, int, str]:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UnsafeAddress(f"not an http(s) URL with a host: {url[:100]!r}")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise UnsafeAddress("the URL's port is not a number from 0 to 65535") from None
    try:
        parts.hostname.encode("idna")  # what a lookup sends; a label too long raises UnicodeError
    except UnicodeError:
        raise UnsafeAddress(f"not a host name a lookup can send: {parts.hostname[:100]!r}") from None
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    # URLValidator allows any non-space character; an HTTP request line is ASCII (percent-encoded).
    return parts.scheme, parts.hostname, port, urllib.parse.quote(path, safe=_PRINTABLE_ASCII)


_PRINTABLE_ASCII = "".join(chr(code) for code in range(0x21, 0x7F))


def resolve(url: str) -> str:
    """The address a delivery to `url` connects to: its host resolved once, every address it
    resolves to vetted (one forbidden address refuses the URL: a name must not mix them).
    Raises UnsafeAddress (refused) or OSError (does not resolve)."""
    _, host, port, _ = _target(url)
    try:
        infos = _lookup(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise OSError(f"{host} does not resolve: {exc}") from None
    addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
    if not addresses:
        raise OSError(f"{host} does not resolve")
    if allow_private():
        return addresses[0]
    for text in addresses:
        why = forbidden(ipaddress.ip_address(text.split("%", 1)[0]))
        if why:
            raise UnsafeAddress(
                f"{host} resolves to {text} ({why}): webhook deliveries go to public addresses only "
                "(SAGAPLANE_WEBHOOK_ALLOW_PRIVATE allows others)"
            )
    return addresses[0]


def check_url(url: str) -> str:
    """At configuration: '' when deliveries to `url` may be made now, else why not."""
    if allow_private():
        return ""
    try:
        resolve(url)
    except UnsafeAddress as exc:
        return str(exc)
    except OSError as exc:
        return f"{exc}: a webhook's host must resolve to a public address"
    return ""


class _PinnedHTTP(http.client.HTTPConnection):
    """Connects to the vetted address; the Host header stays the URL's host."""

    def __init__(self, host: str, port: int, address: str, timeout: float) -> None:
        super().__init__(host, port, timeout=timeout)
        self._address = address

    def connect(self) -> None:
        self.sock = _connect((self._address, self.port), self.timeout)


class _PinnedHTTPS(http.client.HTTPSConnection):
    """TLS to the vetted address, verifying the certificate for the URL's host name (SNI too)."""

    def __init__(self, host: str, port: int, address: str, timeout: float) -> None:
        self._tls = ssl.create_default_context()
        super().__init__(host, port, timeout=timeout, context=self._tls)
        self._address = address

    def connect(self) -> None:
        raw = _connect((self._address, self.port), self.timeout)
        self.sock = self._tls.wrap_socket(raw, server_hostname=self.host)


def pinned_connection(url: str, timeout: float) -> tuple[http.client.HTTPConnection, str]:
    """An HTTP(S) connection to `url`'s host at the address `resolve` vetted (and the request
    path): every outbound request to a tenant-given URL (webhooks, witnesses) goes through it."""
    scheme, host, port, path = _target(url)
    address = resolve(url)
    connection_class = _PinnedHTTPS if scheme == "https" else _PinnedHTTP
    return connection_class(host, port, address, timeout), path
