"""Bot tokens at rest: AES-256-GCM under a key derived (HKDF-SHA256) from each master key
(`SAGAPLANE_MASTER_KEY`, read by controlplane/config.py), with the tenant and the Slack team as
associated data. The first master key encrypts, every one decrypts (rotation: prepend a new key);
a ciphertext copied into another tenant's row, or another team's, does not decrypt."""

from __future__ import annotations

import base64
import os

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from django.conf import settings

VERSION = "v1"
_INFO = b"sagaplane slack bot token v1"


class TokenUnreadable(Exception):
    """The stored token does not decrypt under any master key, or not for this tenant and team."""


def _keys() -> list[AESGCM]:
    keys = []
    for master in settings.SAGAPLANE_MASTER_KEYS:
        raw = base64.urlsafe_b64decode(master)
        derived = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_INFO).derive(raw)
        keys.append(AESGCM(derived))
    return keys


def _bound_to(tenant_id: int, team_id: str) -> bytes:
    return f"tenant={tenant_id};team={team_id}".encode()


def encrypt_token(token: str, *, tenant_id: int, team_id: str) -> str:
    nonce = os.urandom(12)
    sealed = _keys()[0].encrypt(nonce, token.encode(), _bound_to(tenant_id, team_id))
    return f"{VERSION}:{base64.urlsafe_b64encode(nonce + sealed).decode('ascii')}"


def decrypt_token(stored: str, *, tenant_id: int, team_id: str) -> str:
    version, _, body = stored.partition(":")
    if version != VERSION:
        raise TokenUnreadable("unknown token format")
    try:
        blob = base64.urlsafe_b64decode(body)
    except ValueError:
        raise TokenUnreadable("malformed token") from None
    nonce, sealed = blob[:12], blob[12:]
    for key in _keys():
        try:
            return key.decrypt(nonce, sealed, _bound_to(tenant_id, team_id)).decode()
        except InvalidTag:
            continue
    raise TokenUnreadable("the token does not decrypt for this tenant and team")
