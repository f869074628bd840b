"""Passkeys: registration, sign-in, and verified assertions for approval votes.

Every ceremony asks for user verification (the options say `required`, and the library is told
`require_user_verification=True`), uses a challenge the server issued and consumes once, and
enforces the sign counter (a nonzero counter that does not grow is refused, under the passkey's
row lock, so two assertions racing with one counter cannot both pass).

Challenges of registration and sign-in live in the cache (Redis in production) under a key made
of the ceremony, the person (registration) and the challenge's hash, for `CHALLENGE_TTL_S`. The
browser sends the challenge back inside clientDataJSON, so the server needs no session state:
it reads the challenge there and deletes its key; only the request whose delete removed the key
goes on (Redis DEL is atomic), so a challenge serves one ceremony, success or not. Approval votes
bring their own challenge (SHA-256 of the action digest and a server nonce, which the approvals
app issues and consumes); `verify_assertion` checks an assertion against it.

The library checks signature, challenge, origin, RP id hash, flags and counter; it does not
check whose credential it is. Here the credential is looked up by its id, must be live, and must
belong to the person signing in (its user handle) or voting (the member's user).

State changes (register, rename, revoke) take a keyword-only `actor` and are recorded in the
server stream of every tenant the person is a member of, in the same transaction: each tenant's
log can say which public key its member registered, and an auditor can tie a vote's key to it.
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.contrib.auth.models import User
from django.core.cache import cache
from django.db import IntegrityError, transaction
from django.http import HttpRequest
from django.utils import timezone
from sagaplane.events import Event
from webauthn import (
    generate_authentication_options,
    generate_registration_options,
    options_to_json,
    verify_authentication_response,
    verify_registration_response,
)
from webauthn.helpers import (
    decode_credential_public_key,
    parse_authentication_credential_json,
    parse_client_data_json,
    parse_registration_credential_json,
)
from webauthn.helpers.cose import COSEAlgorithmIdentifier
from webauthn.helpers.exceptions import WebAuthnException
from webauthn.helpers.structs import (
    AttestationConveyancePreference,
    AuthenticationCredential,
    AuthenticatorSelectionCriteria,
    AuthenticatorTransport,
    PublicKeyCredentialDescriptor,
    RegistrationCredential,
    ResidentKeyRequirement,
    UserVerificationRequirement,
)

from core.actionaudit import append_server_record
from core.actors import Actor
from core.errors import DomainError
from passkeys.models import Passkey, PasskeyAccount
from tenants.entry import in_each_tenant
from tenants.models import Membership
from tenants.selectors import memberships_of

CHALLENGE_BYTES = 32
CHALLENGE_TTL_S = 300
CEREMONY_TIMEOUT_MS = 120_000
NAME_MAX = 100
MAX_CREDENTIAL_JSON = 64 * 1024  # a real assertion or attestation is a few kilobytes
SUPPORTED_ALGORITHMS = [
    COSEAlgorithmIdentifier.EDDSA,
    COSEAlgorithmIdentifier.ECDSA_SHA_256,
    COSEAlgorithmIdentifier.RSASSA_PKCS1_v1_5_SHA_256,
]
REGISTER = "register"
SIGN_IN = "sign-in"


class PasskeyRefused(DomainError):
    """A ceremony or change refused: nothing was changed (a consumed challenge stays consumed).
    A kind of its own: a vote catches a passkey's refusal apart from the approval's own."""


# ------------------------------------------------------------------------------------- encoding


def b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def unb64url(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


# ---------------------------------------------------------------------------- relying party


def rp_id() -> str:
    return str(settings.SAGAPLANE_WEBAUTHN_RP_ID)


def origins_for(request: HttpRequest | None) -> list[str]:
    """The origins a ceremony may come from: SAGAPLANE_WEBAUTHN_ORIGINS when set; else the
    origin this request reached (host already checked against ALLOWED_HOSTS) if its host is the
    RP id or a name under it, so development on localhost works at any port."""
    configured = list(settings.SAGAPLANE_WEBAUTHN_ORIGINS)
    if configured or request is None:
        return [origin.rstrip("/") for origin in configured]
    origin = f"{request.scheme}://{request.get_host()}"
    host = urlsplit(origin).hostname or ""
    if host == rp_id() or host.endswith("." + rp_id()):
        return [origin]
    return []


def _checked_origins(origins: Sequence[str] | None) -> list[str]:
    allowed = list(origins) if origins is not None else origins_for(None)
    if not allowed:
        raise PasskeyRefused(
            "origin_not_allowed",
            f"this address is not an origin of the relying party {rp_id()} "
            "(SAGAPLANE_WEBAUTHN_RP_ID, SAGAPLANE_WEBAUTHN_ORIGINS)",
            status=403,
            field="credential",
        )
    return allowed


# ------------------------------------------------------------------------------- challenges


def _challenge_key(ceremony: str, user_id: int | None, challenge: bytes) -> str:
    return f"passkeys:challenge:{ceremony}:{user_id or '-'}:{hashlib.sha256(challenge).hexdigest()}"


def _issue_challenge(ceremony: str, user_id: int | None) -> bytes:
    challenge = secrets.token_bytes(CHALLENGE_BYTES)
    cache.set(_challenge_key(ceremony, user_id, challenge), 1, timeout=CHALLENGE_TTL_S)
    return challenge


def _consume_challenge(ceremony: str, user_id: int | None, client_data_json: bytes) -> bytes:
    """The challenge inside clientDataJSON, if this server issued it for this ceremony (and
    person) and nobody has used it yet; it is used now, whatever happens next."""
    try:
        challenge = parse_client_data_json(client_data_json).challenge
    except (WebAuthnException, ValueError, TypeError, KeyError, AttributeError):
        raise PasskeyRefused(
            "malformed_credential", "clientDataJSON is not valid client data", field="credential"
        ) from None
    if not isinstance(challenge, bytes) or len(challenge) != CHALLENGE_BYTES:
        raise PasskeyRefused(
            "unknown_challenge", "the challenge was not issued by this server", field="credential"
        )
    if not cache.delete(_challenge_key(ceremony, user_id, challenge)):
        raise PasskeyRefused(
            "unknown_challenge",
            "the challenge is unknown, expired or already used: start again",
            field="credential",
        )
    return challenge


# ----------------------------------------------------------------------------------- parsing


def _loads(response_json: str | bytes | dict[str, Any]) -> dict[str, Any]:
    if isinstance(response_json, dict):
        return response_json
    if len(response_json) > MAX_CREDENTIAL_JSON:
        raise PasskeyRefused("malformed_credential", "the credential is too large", field="credential")
    try:
        value = json.loads(response_json)
    except (ValueError, RecursionError, UnicodeDecodeError):
        raise PasskeyRefused(
            "malformed_credential", "the credential is not JSON", field="credential"
        ) from None
    if not isinstance(value, dict):
        raise PasskeyRefused(
            "malformed_credential", "the credential is not a JSON object", field="credential"
        )
    return value


def _parse_assertion(response_json: str | bytes | dict[str, Any]) -> AuthenticationCredential:
    try:
        return parse_authentication_credential_json(_loads(response_json))
    except PasskeyRefused:
        raise
    except (WebAuthnException, ValueError, TypeError, KeyError, AttributeError):
        raise PasskeyRefused(
            "malformed_credential", "the assertion is not a WebAuthn credential", field="credential"
        ) from None


def _parse_attestation(response_json: str | bytes | dict[str, Any]) -> RegistrationCredential:
    try:
        return parse_registration_credential_json(_loads(response_json))
    except PasskeyRefused:
        raise
    except (WebAuthnException, ValueError, TypeError, KeyError, AttributeError):
        raise PasskeyRefused(
            "malformed_credential", "the attestation is not a WebAuthn credential", field="credential"
        ) from None


# ------------------------------------------------------------------------------ registration


def account_handle(user: User) -> bytes:
    account, _ = PasskeyAccount.objects.get_or_create(user=user)
    return bytes(account.handle)


def live_passkeys(user: User) -> list[Passkey]:
    return list(Passkey.objects.filter(user=user, revoked_at__isnull=True).order_by("created_at", "pk"))


def registration_options(user: User) -> dict[str, Any]:
    """Options for navigator.credentials.create(): a discoverable credential (so it can sign in
    without a name typed), user verification required, none of the person's live passkeys again."""
    options = generate_registration_options(
        rp_id=rp_id(),
        rp_name=str(settings.SAGAPLANE_WEBAUTHN_RP_NAME),
        user_name=user.get_username(),
        user_id=account_handle(user),
        user_display_name=getattr(user, "email", "") or user.get_username(),
        challenge=_issue_challenge(REGISTER, int(user.pk)),
        timeout=CEREMONY_TIMEOUT_MS,
        attestation=AttestationConveyancePreference.NONE,
        authenticator_selection=AuthenticatorSelectionCriteria(
            resident_key=ResidentKeyRequirement.REQUIRED,
            user_verification=UserVerificationRequirement.REQUIRED,
        ),
        exclude_credentials=[
            PublicKeyCredentialDescriptor(id=unb64url(p.credential_id)) for p in live_passkeys(user)
        ],
        supported_pub_key_algs=SUPPORTED_ALGORITHMS,
    )
    result: dict[str, Any] = json.loads(options_to_json(options))
    return result


def _clean_name(name: Any) -> str:
    text = name.strip() if isinstance(name, str) else ""
    if not text or len(text) > NAME_MAX or "\x00" in text:
        raise PasskeyRefused("invalid_name", f"a name of 1 to {NAME_MAX} characters", field="name")
    return text


def _record(user: User, event: str, fields: dict[str, Any], *, actor: Actor) -> None:
    """The change, in the server stream of every tenant the person belongs to (this transaction):
    a person's change crosses tenants on purpose, entering each in turn."""
    subject = getattr(user, "email", "") or user.get_username()
    in_each_tenant(
        [membership.tenant for membership in memberships_of(user)],
        lambda tenant: append_server_record(tenant, event, {"subject": subject, **fields}, actor=actor),
    )


def _summary(passkey: Passkey) -> dict[str, Any]:
    return {
        "passkey": passkey.pk,
        "credential_id": passkey.credential_id,
        "public_key": b64url(bytes(passkey.public_key)),
        "algorithm": passkey.algorithm,
    }


def register(
    user: User,
    name: Any,
    response_json: str | bytes | dict[str, Any],
    *,
    origins: Sequence[str] | None = None,
    actor: Actor,
) -> Passkey:
    """Verify navigator.credentials.create()'s answer to a challenge issued to this person, and
    keep the credential under `name`."""
    name = _clean_name(name)
    credential = _parse_attestation(response_json)
    allowed = _checked_origins(origins)
    challenge = _consume_challenge(REGISTER, int(user.pk), bytes(credential.response.client_data_json))
    try:
        verified = verify_registration_response(
            credential=credential,
            expected_challenge=challenge,
            expected_rp_id=rp_id(),
            expected_origin=allowed,
            require_user_verification=True,
            supported_pub_key_algs=SUPPORTED_ALGORITHMS,
        )
    except (WebAuthnException, ValueError, TypeError, KeyError):
        raise PasskeyRefused(
            "registration_refused", "the authenticator's answer did not verify", field="credential"
        ) from None
    try:
        algorithm = int(decode_credential_public_key(verified.credential_public_key).alg)
    except (WebAuthnException, ValueError, TypeError, KeyError):
        raise PasskeyRefused(
            "registration_refused", "the credential's public key is not usable", field="credential"
        ) from None
    transports = [
        t.value for t in (credential.response.transports or []) if isinstance(t, AuthenticatorTransport)
    ]
    try:
        with transaction.atomic():
            passkey = Passkey.objects.create(
                user=user,
                name=name,
                credential_id=b64url(verified.credential_id),
                public_key=verified.credential_public_key,
                algorithm=algorithm,
                sign_count=verified.sign_count,
                aaguid=verified.aaguid,
                transports=transports,
                backed_up=verified.credential_backed_up,
            )
            _record(
                user,
                Event.ADMIN_PASSKEY_REGISTERED,
                {**_summary(passkey), "old": None, "new": {"name": name, "revoked_at": None}},
                actor=actor,
            )
    except IntegrityError:
        raise PasskeyRefused(
            "credential_taken", "this credential is already registered", status=409, field="credential"
        ) from None
    return passkey


def _own_locked(user: User, passkey_id: int) -> Passkey:
    passkey = Passkey.objects.select_for_update().filter(pk=passkey_id, user=user).first()
    if passkey is None:
        raise PasskeyRefused("not_found", "no such passkey of yours", status=404, field="passkey")
    return passkey


def rename(user: User, passkey_id: int, name: Any, *, actor: Actor) -> Passkey:
    name = _clean_name(name)
    with transaction.atomic():
        passkey = _own_locked(user, passkey_id)
        if passkey.name == name:
            return passkey
        old = passkey.name
        passkey.name = name
        passkey.save(update_fields=["name"])
        _record(
            user,
            Event.ADMIN_PASSKEY_RENAMED,
            {**_summary(passkey), "old": {"name": old}, "new": {"name": name}},
            actor=actor,
        )
    return passkey


def revoke(user: User, passkey_id: int, *, actor: Actor) -> Passkey:
    """The passkey signs nothing from now on (sign-in, votes); it stays listed as revoked."""
    with transaction.atomic():
        passkey = _own_locked(user, passkey_id)
        if passkey.revoked_at is not None:
            return passkey
        passkey.revoked_at = timezone.now()
        passkey.save(update_fields=["revoked_at"])
        _record(
            user,
            Event.ADMIN_PASSKEY_REVOKED,
            {
                **_summary(passkey),
                "name": passkey.name,
                "old": {"revoked_at": None},
                "new": {"revoked_at": passkey.revoked_at},
            },
            actor=actor,
        )
    return passkey


# ------------------------------------------------------------------------------- assertions


@dataclass(frozen=True)
class VerifiedAssertion:
    """A WebAuthn assertion that verified, with everything needed to verify it again offline:
    the signature over authenticatorData ‖ SHA-256(clientDataJSON) with the credential's COSE
    public key. Binary values are base64url without padding, as WebAuthn's JSON carries them."""

    passkey_id: int
    passkey_name: str
    rp_id: str
    origin: str
    credential_id: str
    public_key: str
    algorithm: int
    client_data_json: str
    authenticator_data: str
    signature: str
    sign_count: int
    user_verified: bool

    def as_record(self) -> dict[str, Any]:
        """The assertion as kept in an approval vote's record (`sagaplane verify-approval`)."""
        return {
            "format": "webauthn.get/1",
            "rp_id": self.rp_id,
            "origin": self.origin,
            "credential_id": self.credential_id,
            "public_key": self.public_key,
            "algorithm": self.algorithm,
            "client_data_json": self.client_data_json,
            "authenticator_data": self.authenticator_data,
            "signature": self.signature,
            "sign_count": self.sign_count,
            "passkey": {"id": self.passkey_id, "name": self.passkey_name},
        }


def _verify(
    credential: AuthenticationCredential, passkey: Passkey, challenge: bytes, origins: list[str]
) -> VerifiedAssertion:
    """Library verification against the locked, live passkey row, then the counter is stored."""
    try:
        verified = verify_authentication_response(
            credential=credential,
            expected_challenge=challenge,
            expected_rp_id=rp_id(),
            expected_origin=origins,
            credential_public_key=bytes(passkey.public_key),
            credential_current_sign_count=passkey.sign_count,
            require_user_verification=True,
        )
    except (WebAuthnException, ValueError, TypeError, KeyError) as exc:
        raise PasskeyRefused(
            "assertion_refused", f"the passkey's answer did not verify: {_reason(exc)}", field="credential"
        ) from None
    if not verified.user_verified:  # required above; kept explicit
        raise PasskeyRefused(
            "assertion_refused", "the authenticator did not verify the user", field="credential"
        )
    client_data = bytes(credential.response.client_data_json)
    passkey.sign_count = verified.new_sign_count
    passkey.last_used_at = timezone.now()
    passkey.save(update_fields=["sign_count", "last_used_at"])
    return VerifiedAssertion(
        passkey_id=passkey.pk,
        passkey_name=passkey.name,
        rp_id=rp_id(),
        origin=str(json.loads(client_data)["origin"]),
        credential_id=passkey.credential_id,
        public_key=b64url(bytes(passkey.public_key)),
        algorithm=passkey.algorithm,
        client_data_json=b64url(client_data),
        authenticator_data=b64url(bytes(credential.response.authenticator_data)),
        signature=b64url(bytes(credential.response.signature)),
        sign_count=verified.new_sign_count,
        user_verified=verified.user_verified,
    )


def _reason(exc: Exception) -> str:
    """The library's sentence, which names the failed check (never key material)."""
    text = str(exc) or type(exc).__name__
    return text[:200]


def _live_passkey_locked(credential: AuthenticationCredential) -> Passkey:
    passkey = (
        Passkey.objects.select_for_update()
        .select_related("user")
        .filter(credential_id=b64url(bytes(credential.raw_id)), revoked_at__isnull=True)
        .first()
    )
    if passkey is None:
        raise PasskeyRefused(
            "unknown_credential", "this passkey is not registered here, or was revoked", field="credential"
        )
    return passkey


def verify_assertion(
    member: Membership | User,
    challenge: bytes,
    response_json: str | bytes | dict[str, Any],
    *,
    origins: Sequence[str] | None = None,
) -> VerifiedAssertion:
    """Verify an assertion made for `challenge` (the caller issued it and consumes it) with a
    live passkey of the member's own, user verified, counter growing; store the counter. Call it
    inside the transaction that records what the assertion authorises: the counter update then
    commits or rolls back with it. Raises PasskeyRefused."""
    user = member.user if isinstance(member, Membership) else member
    credential = _parse_assertion(response_json)
    allowed = _checked_origins(origins)
    with transaction.atomic():
        passkey = _live_passkey_locked(credential)
        if passkey.user_id != user.pk:
            raise PasskeyRefused(
                "not_your_passkey", "this passkey belongs to someone else", status=403, field="credential"
            )
        return _verify(credential, passkey, challenge, allowed)


def vote_options(user: User, challenge: bytes) -> dict[str, Any]:
    """Options for navigator.credentials.get() answering an approval's challenge (issued and
    consumed by the approvals app): only this person's live passkeys, user verification required."""
    options = generate_authentication_options(
        rp_id=rp_id(),
        challenge=challenge,
        timeout=CEREMONY_TIMEOUT_MS,
        allow_credentials=[
            PublicKeyCredentialDescriptor(id=unb64url(p.credential_id)) for p in live_passkeys(user)
        ],
        user_verification=UserVerificationRequirement.REQUIRED,
    )
    result: dict[str, Any] = json.loads(options_to_json(options))
    return result


def assertion_challenge(response_json: str | bytes | dict[str, Any]) -> bytes:
    """The challenge an assertion answers (from its clientDataJSON, unverified: `verify_assertion`
    then checks the signature over it). Raises PasskeyRefused when the assertion is malformed."""
    credential = _parse_assertion(response_json)
    try:
        challenge = parse_client_data_json(bytes(credential.response.client_data_json)).challenge
    except (WebAuthnException, ValueError, TypeError, KeyError, AttributeError):
        raise PasskeyRefused(
            "malformed_credential", "clientDataJSON is not valid client data", field="credential"
        ) from None
    return bytes(challenge)


# ----------------------------------------------------------------------------------- sign-in


SIGN_IN_CHALLENGES_PER_MINUTE = 30


def sign_in_rate_key(client_address: str, minute: int) -> str:
    address = hashlib.sha256(client_address.encode()).hexdigest()[:32]
    return f"passkeys:sign-in-rate:{address}:{minute}"


def sign_in_challenge_allowed(client_address: str, *, now: float | None = None) -> bool:
    """At most SIGN_IN_CHALLENGES_PER_MINUTE anonymous sign-in challenges per client address and
    clock minute: each is a cache entry for CHALLENGE_TTL_S, so an address cannot fill the cache."""
    key = sign_in_rate_key(client_address, int((time.time() if now is None else now) // 60))
    if cache.add(key, 1, timeout=120):
        return True
    try:
        return int(cache.incr(key)) <= SIGN_IN_CHALLENGES_PER_MINUTE
    except ValueError:  # expired between add and incr: a fresh minute
        return bool(cache.add(key, 1, timeout=120))


def sign_in_options() -> dict[str, Any]:
    """Options for navigator.credentials.get() with no credential named: the authenticator offers
    the person's discoverable passkeys for this relying party."""
    options = generate_authentication_options(
        rp_id=rp_id(),
        challenge=_issue_challenge(SIGN_IN, None),
        timeout=CEREMONY_TIMEOUT_MS,
        user_verification=UserVerificationRequirement.REQUIRED,
    )
    result: dict[str, Any] = json.loads(options_to_json(options))
    return result


def sign_in(response_json: str | bytes | dict[str, Any], *, origins: Sequence[str] | None = None) -> Any:
    """The person whose live passkey answered a sign-in challenge (consumed here), or a refusal."""
    credential = _parse_assertion(response_json)
    allowed = _checked_origins(origins)
    challenge = _consume_challenge(SIGN_IN, None, bytes(credential.response.client_data_json))
    with transaction.atomic():
        passkey = _live_passkey_locked(credential)
        handle = credential.response.user_handle
        if handle is not None:
            account = PasskeyAccount.objects.filter(user_id=passkey.user_id).first()
            if account is None or bytes(account.handle) != bytes(handle):
                raise PasskeyRefused(
                    "unknown_credential", "the passkey's account does not match", field="credential"
                )
        if not passkey.user.is_active:
            raise PasskeyRefused(
                "unknown_credential", "this account cannot sign in", status=403, field="credential"
            )
        _verify(credential, passkey, challenge, allowed)
        return passkey.user
