"""Signing and sending a webhook delivery (recovery jobs and reconciliation checks). The receiver's
check is the snippet in docs/ARCHITECTURE.md (§8.8, "Verifying a recovery webhook"); a test
extracts and runs exactly that code.

Deliveries are signed as Standard Webhooks 1.0 says, so receivers verify them with the standard's
libraries: `webhook-id` (stable for the delivery however often it is retried: a digest of its
idempotency key, so no `.` and nothing the agent chose), `webhook-timestamp` (unix seconds) and
`webhook-signature: v1,<base64 HMAC-SHA256 of "<id>.<timestamp>." + the raw body>`, keyed with the
secret's bytes (`whsec_<base64>`, the standard's serialisation). The timestamp is signed, so a
captured delivery cannot be replayed after the receiver's tolerance, and the body is the exact
bytes sent. Deprecated, for one release beside them: `Sagaplane-Signature: t=<unix seconds>,
v1=<hex HMAC-SHA256 of "<t>." + the body>` keyed with the secret's text as shown.

A tenant's URL must not turn the control plane into a proxy into its own network: unless
`SAGAPLANE_WEBHOOK_ALLOW_PRIVATE` is on (development and the embedded demo), a URL whose host
resolves to any address that is not globally routable (loopback, private, link-local such as the
169.254.169.254 metadata service, shared, multicast, reserved, unspecified; an IPv6 address
carrying an IPv4 one judged by that one too, and 6to4, Teredo, local-use NAT64 and IPv4-compatible
addresses refused outright: `forbidden`) is refused when it is configured (`check_url`) and again at each
delivery, after resolving the name once more: the connection then goes to exactly the address
that was vetted (no second lookup a rebinding DNS server could answer differently), and a
redirect is an answer (a failed attempt), never followed."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import http.client
import ipaddress
import secrets
import socket
import ssl
import time
import urllib.parse

STANDARD_ID_HEADER = "webhook-id"
STANDARD_TIMESTAMP_HEADER = "webhook-timestamp"
STANDARD_SIGNATURE_HEADER = "webhook-signature"
SIGNATURE_HEADER = "Sagaplane-Signature"  # deprecated: sent beside the standard's for one release
IDEMPOTENCY_HEADER = "Idempotency-Key"
SECRET_PREFIX = "whsec_"
TIMEOUT_S = 10.0


# Indirections the tests replace (a rebinding name server, a connection that records its address).
_lookup = socket.getaddrinfo
_connect = socket.create_connection


class UnsafeAddress(OSError):
    """The webhook's host is (or resolves to) an address deliveries may not go to. An OSError,
    so a delivery refused for it is a failed attempt like an unreachable receiver."""


def new_secret() -> str:
    """A webhook's signing secret as Standard Webhooks serialises one: `whsec_` and the base64 of
    32 random bytes (the standard asks for 24 to 64)."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()


def standard_key(secret: str) -> bytes:
    """The HMAC key of a `whsec_<base64>` secret. Secrets issued before Standard Webhooks signing are
    url-safe base64 without padding: their key is the bytes they encode (the docs say how a
    receiver converts one for the standard's libraries)."""
    encoded = secret.removeprefix(SECRET_PREFIX)
    try:
        return base64.b64decode(encoded, validate=True)
    except binascii.Error:
        pass
    try:
        return base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4))
    except (binascii.Error, ValueError):
        return secret.encode()  # not base64 at all (no secret this module issued)


def message_id(idempotency_key: str) -> str:
    """The delivery's `webhook-id`: the same for every attempt (and for another delivery of the
    same effect), with no `.` and nothing the agent chose, as the standard asks."""
    return "msg_" + hashlib.sha256(idempotency_key.encode()).hexdigest()[:32]


def sign(secret: str, body: bytes, *, timestamp: int | None = None) -> str:
    """The deprecated `Sagaplane-Signature` header's value."""
    ts = int(time.time()) if timestamp is None else timestamp
    mac = hmac.new(secret.encode(), f"{ts}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={ts},v1={mac}"


def signed_headers(
    secret: str, body: bytes, *, idempotency_key: str, timestamp: int | None = None
) -> dict[str, str]:
    """The headers that sign one delivery attempt of `body`: Standard Webhooks' three, the
    deprecated `Sagaplane-Signature` beside them, and the `Idempotency-Key`."""
    ts = int(time.time()) if timestamp is None else timestamp
    msg_id = message_id(idempotency_key)
    mac = hmac.new(standard_key(secret), f"{msg_id}.{ts}.".encode() + body, hashlib.sha256).digest()
    return {
        STANDARD_ID_HEADER: msg_id,
        STANDARD_TIMESTAMP_HEADER: str(ts),
        STANDARD_SIGNATURE_HEADER: "v1," + base64.b64encode(mac).decode(),
        SIGNATURE_HEADER: sign(secret, body, timestamp=ts),
        IDEMPOTENCY_HEADER: idempotency_key,
    }


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


def post(
    url: str, body: bytes, *, secret: str, idempotency_key: str, agent: str, read: int = 0
) -> tuple[int, bytes]:
    """POST one signed delivery: its HTTP status and at most `read` bytes of the answer. Any
    status is an answer (a 3xx is not followed; only a 2xx's body is read); an unreachable or
    refused receiver raises OSError (UnsafeAddress when its address is forbidden)."""
    scheme, host, port, path = _target(url)
    address = resolve(url)
    connection_class = _PinnedHTTPS if scheme == "https" else _PinnedHTTP
    connection = connection_class(host, port, address, TIMEOUT_S)
    try:
        connection.request(
            "POST",
            path,
            body=body,
            headers={
                "Content-Type": "application/json",
                "Accept": "application/json",
                **signed_headers(secret, body, idempotency_key=idempotency_key),
                "User-Agent": agent,
            },
        )
        response = connection.getresponse()
        status = response.status
        raw = response.read(read) if read and 200 <= status < 300 else b""
        return status, raw
    except http.client.HTTPException as exc:
        raise OSError(f"the webhook's answer was not HTTP: {exc!r}") from None
    finally:
        connection.close()
