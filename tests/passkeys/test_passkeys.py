"""Passkeys: registration, sign-in and assertions for votes, against real WebAuthn material from a
software authenticator (real ES256 / Ed25519 signatures), with every hostile variant refused and
nothing changed by a refusal."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from django.test import Client

from passkeys import services
from passkeys.models import Passkey
from passkeys.services import PasskeyRefused
from tenants import services as tenants
from tenants.actors import named_actor, user_actor
from tenants.models import Role, Tenant
from tenants.selectors import memberships_of
from tests.passkeys.authenticator import ORIGIN, SoftAuthenticator, b64url, unb64url
from tests.support.chains import server_stream
from tests.support.factories import Person
from tests.support.scoping import in_tenant

pytestmark = pytest.mark.django_db


def enrol(
    user: Any, name: str = "laptop", auth: SoftAuthenticator | None = None
) -> tuple[SoftAuthenticator, Passkey]:
    auth = auth or SoftAuthenticator()
    options = services.registration_options(user)
    passkey = services.register(user, name, auth.create(options), origins=[ORIGIN], actor=named_actor("test"))
    return auth, passkey


def refused(code: str, call: Any, *args: Any, **kwargs: Any) -> PasskeyRefused:
    with pytest.raises(PasskeyRefused) as caught:
        call(*args, **kwargs)
    assert caught.value.code == code, caught.value.detail
    return caught.value


def events(tenant: Tenant, prefix: str = "ADMIN_PASSKEY_") -> list[dict[str, Any]]:
    return [r for r in server_stream(tenant) if r["event"].startswith(prefix)]


# ----------------------------------------------------------------------------- registration


def test_a_person_registers_several_named_passkeys_recorded_in_every_tenant_of_theirs(
    alice: Person, tenant_b: Tenant
) -> None:
    in_tenant(tenants.add_member, tenant_b, alice.user.email, Role.APPROVER, actor=named_actor("test"))
    _, first = enrol(alice.user, "laptop")
    options = services.registration_options(alice.user)
    assert options["authenticatorSelection"]["userVerification"] == "required"
    assert options["authenticatorSelection"]["residentKey"] == "required"
    assert [c["id"] for c in options["excludeCredentials"]] == [first.credential_id]
    phone = SoftAuthenticator(algorithm="EdDSA")
    second = services.register(
        alice.user, " phone ", phone.create(options), origins=[ORIGIN], actor=user_actor("alice")
    )

    assert [p.name for p in services.live_passkeys(alice.user)] == ["laptop", "phone"]
    assert (first.algorithm, second.algorithm) == (-7, -8)
    for tenant in (alice.tenant, tenant_b):
        registered = events(tenant)
        assert [r["new"]["name"] for r in registered] == ["laptop", "phone"]
        assert registered[1]["public_key"] == b64url(phone.cose_key())
        assert registered[1]["subject"] == alice.user.email and registered[1]["actor"] == "user:alice"
        assert registered[1]["old"] is None and registered[1]["new"] == {"name": "phone", "revoked_at": None}


def test_registration_needs_user_verification_and_a_challenge_issued_to_this_person_once(
    alice: Person, bob: Person
) -> None:
    auth = SoftAuthenticator()
    refused(
        "registration_refused",
        services.register,
        alice.user,
        "no uv",
        auth.create(services.registration_options(alice.user), uv=False),
        origins=[ORIGIN],
        actor=named_actor("test"),
    )
    response = auth.create(services.registration_options(alice.user))
    refused(
        "unknown_challenge",
        services.register,
        bob.user,
        "stolen",
        response,
        origins=[ORIGIN],
        actor=named_actor("test"),
    )
    # Bob's attempt used nothing of Alice's: her challenge is still hers, once.
    services.register(alice.user, "laptop", response, origins=[ORIGIN], actor=named_actor("test"))
    refused(
        "unknown_challenge",
        services.register,
        alice.user,
        "again",
        response,
        origins=[ORIGIN],
        actor=named_actor("test"),
    )
    other = SoftAuthenticator()
    refused(
        "registration_refused",
        services.register,
        alice.user,
        "phished",
        other.create(services.registration_options(alice.user), origin="https://evil.example"),
        origins=[ORIGIN],
        actor=named_actor("test"),
    )
    assert [p.name for p in Passkey.objects.all()] == ["laptop"]
    assert len(events(alice.tenant)) == 1


def test_malformed_registrations_are_refused_with_400(alice: Person) -> None:
    bad_client_data = {"clientDataJSON": "!!", "attestationObject": "AA"}
    oversized = "x" * (services.MAX_CREDENTIAL_JSON + 1)
    shaped = json.dumps({"id": "a", "rawId": "a", "type": "public-key", "response": bad_client_data})
    for junk in ("", "[]", "{", '{"id": 1}', oversized, shaped):
        error = refused(
            "malformed_credential",
            services.register,
            alice.user,
            "n",
            junk,
            origins=[ORIGIN],
            actor=named_actor("t"),
        )
        assert error.status == 400
    refused(
        "invalid_name", services.register, alice.user, " ", "{}", origins=[ORIGIN], actor=named_actor("t")
    )
    assert not Passkey.objects.exists()


# ------------------------------------------------------------------------- rename and revoke


def test_rename_and_revoke_are_the_owners_alone_and_recorded_with_old_and_new(
    alice: Person, bob: Person
) -> None:
    _, passkey = enrol(alice.user, "laptop")
    before = len(server_stream(alice.tenant))
    refused("not_found", services.rename, bob.user, passkey.pk, "mine now", actor=user_actor("bob"))
    refused("not_found", services.revoke, bob.user, passkey.pk, actor=user_actor("bob"))
    assert len(server_stream(alice.tenant)) == before

    services.rename(alice.user, passkey.pk, "work laptop", actor=user_actor("alice"))
    services.rename(
        alice.user, passkey.pk, "work laptop", actor=user_actor("alice")
    )  # no-op: nothing written
    services.revoke(alice.user, passkey.pk, actor=user_actor("alice"))
    services.revoke(alice.user, passkey.pk, actor=user_actor("alice"))
    renamed, revoked = events(alice.tenant)[1:]
    assert renamed["event"] == "ADMIN_PASSKEY_RENAMED"
    assert (renamed["old"], renamed["new"]) == ({"name": "laptop"}, {"name": "work laptop"})
    assert revoked["event"] == "ADMIN_PASSKEY_REVOKED" and revoked["old"] == {"revoked_at": None}
    assert revoked["new"]["revoked_at"]
    assert services.live_passkeys(alice.user) == []


# ------------------------------------------------------------------------------------ sign-in


def browser() -> Client:
    """The dashboard as a browser reaches it at http://localhost:8000 (an origin of RP localhost)."""
    return Client(HTTP_HOST="localhost:8000")


def sign_in(client: Client, auth: SoftAuthenticator, **kwargs: Any) -> Any:
    options = client.post("/login/passkey/options").json()
    assert options["userVerification"] == "required" and options["rpId"] == "localhost"
    return client.post(
        "/login/passkey",
        {"credential": json.dumps(auth.get(options["challenge"], **kwargs)), "next": "/fleet/"},
    )


def test_a_member_signs_in_with_a_passkey_and_nothing_else_signs_in(alice: Person, bob: Person) -> None:
    auth, passkey = enrol(alice.user)
    client = browser()
    assert client.get("/sagas/").status_code == 302
    answer = sign_in(client, auth)
    assert answer.status_code == 200, answer.content
    assert answer.json() == {"redirect": "/fleet/"}
    assert client.get("/sagas/").status_code == 200
    passkey.refresh_from_db()
    assert passkey.sign_count == 1 and passkey.last_used_at is not None

    # A replayed assertion: its challenge is consumed.
    stale = browser()
    options = stale.post("/login/passkey/options").json()
    assertion = json.dumps(auth.get(options["challenge"]))
    assert stale.post("/login/passkey", {"credential": assertion}).status_code == 200
    replay = browser()
    answer = replay.post("/login/passkey", {"credential": assertion})
    assert (answer.status_code, answer.json()["error"]) == (400, "unknown_challenge")
    assert replay.get("/sagas/").status_code == 302

    # A fresh challenge, but a counter that does not grow (a cloned authenticator), no user
    # verification, another origin, or a key the server never saw: refused, nobody signed in.
    for kwargs in ({"counter": 1}, {"uv": False}, {"origin": "https://evil.example"}):
        client = browser()
        answer = sign_in(client, auth, **kwargs)
        assert (answer.status_code, answer.json()["error"]) == (400, "assertion_refused"), kwargs
        assert client.get("/sagas/").status_code == 302
    impostor = SoftAuthenticator(credential_id=auth.credential_id, user_handle=auth.user_handle)
    impostor.sign_count = 100
    answer = sign_in(browser(), impostor)
    assert answer.json()["error"] == "assertion_refused"
    passkey.refresh_from_db()
    assert passkey.sign_count == 2

    # Revoked: signs nothing.
    services.revoke(alice.user, passkey.pk, actor=named_actor("test"))
    answer = sign_in(browser(), auth)
    assert (answer.status_code, answer.json()["error"]) == (400, "unknown_credential")


def test_sign_in_refuses_junk_with_400_and_an_unknown_origin_with_403(alice: Person) -> None:
    auth, _ = enrol(alice.user)
    client = browser()
    for junk in ("", "null", "[1]", "{", '{"id": "AA", "rawId": "AA", "type": "public-key", "response": {}}'):
        answer = client.post("/login/passkey", {"credential": junk})
        assert answer.status_code == 400 and answer.json()["error"] == "malformed_credential", junk
    assert client.get("/login/passkey").status_code == 405
    elsewhere = Client(HTTP_HOST="127.0.0.1:8000")  # an IP address is not under the RP id
    options = elsewhere.post("/login/passkey/options").json()
    answer = elsewhere.post("/login/passkey", {"credential": json.dumps(auth.get(options["challenge"]))})
    assert (answer.status_code, answer.json()["error"]) == (403, "origin_not_allowed")


def test_sign_in_challenges_are_bounded_per_address(db: None) -> None:
    minute = 29_000_000 * 60.0  # a fixed clock minute: no boundary to straddle
    for _ in range(services.SIGN_IN_CHALLENGES_PER_MINUTE):
        assert services.sign_in_challenge_allowed("192.0.2.1", now=minute + 5)
    assert not services.sign_in_challenge_allowed("192.0.2.1", now=minute + 59)
    assert services.sign_in_challenge_allowed("192.0.2.2", now=minute + 59)
    assert services.sign_in_challenge_allowed("192.0.2.1", now=minute + 60)  # the next minute

    # Over HTTP: an address at its limit (this minute and the next) is answered 429.
    from django.core.cache import cache

    this_minute = int(time.time() // 60)
    for m in (this_minute, this_minute + 1):
        cache.set(services.sign_in_rate_key("127.0.0.1", m), services.SIGN_IN_CHALLENGES_PER_MINUTE, 120)
    refused = browser().post("/login/passkey/options")
    assert (refused.status_code, refused.json()["error"], refused["Retry-After"]) == (
        429,
        "rate_limited",
        "60",
    )
    elsewhere = Client(HTTP_HOST="localhost:8000", REMOTE_ADDR="10.0.0.7")
    assert elsewhere.post("/login/passkey/options").status_code == 200


def test_next_is_followed_only_on_this_site(alice: Person) -> None:
    auth, _ = enrol(alice.user)
    client = browser()
    options = client.post("/login/passkey/options").json()
    answer = client.post(
        "/login/passkey",
        {"credential": json.dumps(auth.get(options["challenge"])), "next": "https://evil.example/"},
    )
    assert answer.json() == {"redirect": "/"}


# ------------------------------------------------------------------------- assertions for votes


def vote_challenge(label: str) -> bytes:
    import hashlib

    return hashlib.sha256(label.encode()).digest()


def test_verify_assertion_returns_everything_needed_to_verify_it_again(alice: Person) -> None:
    auth, passkey = enrol(alice.user, auth=SoftAuthenticator(algorithm="EdDSA"))
    challenge = vote_challenge("request-1")
    membership = memberships_of(alice.user)[0]
    verified = services.verify_assertion(
        membership, challenge, json.dumps(auth.get(challenge)), origins=[ORIGIN]
    )
    assert verified.passkey_id == passkey.pk and verified.user_verified
    record = verified.as_record()
    assert record["public_key"] == b64url(auth.cose_key()) and record["algorithm"] == -8
    client_data = json.loads(unb64url(record["client_data_json"]))
    assert client_data["challenge"] == b64url(challenge) and client_data["type"] == "webauthn.get"
    assert record["rp_id"] == "localhost" and record["origin"] == ORIGIN and record["sign_count"] == 1


HOSTILE = {
    "signed for another request's challenge": lambda auth, mine, other: auth.get(other),
    "replayed (the same assertion again)": None,  # handled in the test
    "a lower sign counter": lambda auth, mine, other: auth.get(mine, counter=1),
    "without user verification": lambda auth, mine, other: auth.get(mine, uv=False),
    "from another origin": lambda auth, mine, other: auth.get(mine, origin="https://evil.example"),
    "for another relying party": lambda auth, mine, other: auth.get(mine, rp_id="evil.example"),
    "a registration, not an assertion": lambda auth, mine, other: auth.get(mine, kind="webauthn.create"),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_hostile_assertions_are_refused_and_change_nothing(case: str, alice: Person) -> None:
    auth, passkey = enrol(alice.user)
    mine, other = vote_challenge("request-1"), vote_challenge("request-2")
    first = auth.get(mine)
    services.verify_assertion(alice.user, mine, first, origins=[ORIGIN])  # counter now 1
    if case.startswith("replayed"):
        hostile = first
    else:
        auth.sign_count = 5
        hostile = HOSTILE[case](auth, mine, other)  # type: ignore[misc]
    refused("assertion_refused", services.verify_assertion, alice.user, mine, hostile, origins=[ORIGIN])
    passkey.refresh_from_db()
    assert passkey.sign_count == 1


def test_another_members_passkey_is_refused_for_a_vote(alice: Person, bob: Person, carol: Person) -> None:
    bobs_auth, bobs = enrol(bob.user, "bob's key")
    challenge = vote_challenge("request-1")
    for member in (alice.user, carol.user):
        error = refused(
            "not_your_passkey",
            services.verify_assertion,
            member,
            challenge,
            bobs_auth.get(challenge),
            origins=[ORIGIN],
        )
        assert error.status == 403
    bobs.refresh_from_db()
    assert bobs.sign_count == 0


def test_a_tampered_signature_an_unknown_key_and_a_revoked_key_are_refused(alice: Person) -> None:
    auth, passkey = enrol(alice.user)
    challenge = vote_challenge("request-1")
    assertion = auth.get(challenge)
    signature = bytearray(unb64url(assertion["response"]["signature"]))
    signature[-1] ^= 1
    assertion["response"]["signature"] = b64url(bytes(signature))
    refused(
        "assertion_refused", services.verify_assertion, alice.user, challenge, assertion, origins=[ORIGIN]
    )
    refused(
        "unknown_credential",
        services.verify_assertion,
        alice.user,
        challenge,
        SoftAuthenticator().get(challenge),
        origins=[ORIGIN],
    )
    services.revoke(alice.user, passkey.pk, actor=named_actor("test"))
    refused(
        "unknown_credential",
        services.verify_assertion,
        alice.user,
        challenge,
        auth.get(challenge),
        origins=[ORIGIN],
    )
    refused(
        "origin_not_allowed",
        services.verify_assertion,
        alice.user,
        challenge,
        auth.get(challenge),
        origins=[],
    )


@pytest.mark.postgres
def test_two_assertions_racing_with_one_counter_value_pass_once(
    transactional_db: None, alice: Person
) -> None:
    """A cloned authenticator: two assertions with the same counter, verified at the same moment
    in two connections. The passkey's row lock serialises them; the second sees the stored counter."""
    import threading

    from django.db import connection

    auth, passkey = enrol(alice.user)
    challenges = [vote_challenge("request-1"), vote_challenge("request-2")]
    assertions = [auth.get(c, counter=7) for c in challenges]
    barrier = threading.Barrier(2)
    outcomes: list[str] = []

    def verify(n: int) -> None:
        try:
            barrier.wait(timeout=10)
            services.verify_assertion(alice.user, challenges[n], assertions[n], origins=[ORIGIN])
            outcomes.append("verified")
        except PasskeyRefused as exc:
            outcomes.append(exc.code)
        finally:
            connection.close()

    threads = [threading.Thread(target=verify, args=(n,)) for n in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert sorted(outcomes) == ["assertion_refused", "verified"]
    passkey.refresh_from_db()
    assert passkey.sign_count == 7


@pytest.mark.postgres
@pytest.mark.redis
def test_one_sign_in_challenge_serves_one_of_two_racing_sign_ins(
    transactional_db: None, alice: Person
) -> None:
    """The same assertion sent twice at once (a replay racing the original): the challenge's key
    is deleted by exactly one of them (Redis DEL), so exactly one signs in."""
    import threading

    from django.db import connection

    auth, _ = enrol(alice.user)
    options = services.sign_in_options()
    assertion = json.dumps(auth.get(options["challenge"]))
    barrier = threading.Barrier(2)
    outcomes: list[str] = []

    def sign_in_once() -> None:
        try:
            barrier.wait(timeout=10)
            services.sign_in(assertion, origins=[ORIGIN])
            outcomes.append("signed in")
        except PasskeyRefused as exc:
            outcomes.append(exc.code)
        finally:
            connection.close()

    threads = [threading.Thread(target=sign_in_once) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert sorted(outcomes) == ["signed in", "unknown_challenge"]
