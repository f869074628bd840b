"""A tenant's witness commands as typed inputs (`core.inputs`): the API's add and quorum, the
Evidence page's forms, the services' signatures (`transparency.witnesses`) and the OpenAPI schema.
The input checks each field on its own; what depends on the tenant (how many witnesses it has, a
key or name already taken) is the service's."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import ValidationError
from django.core.validators import URLValidator
from rest_framework import serializers
from sagaplane import cosignature, note

from core import outbound
from core.errors import DomainError
from core.inputs import Input, Text, Whole

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")
URL_MAX = 500
VKEY_MAX = 4000


def _invalid(field: str, detail: str, code: str = "invalid") -> DomainError:
    return DomainError(code, f"{field}: {detail}", field=field)


@dataclass(frozen=True)
class NewWitness:
    """A witness to send the tenant's checkpoints to: its name in the policy file, its submission
    prefix (no trailing slash) and its cosigner verifier key (stripped)."""

    name: str
    url: str
    vkey: str


@dataclass(frozen=True)
class Quorum:
    """How many witnesses must cosign a checkpoint (0: none required)."""

    quorum: int


class _Url(serializers.CharField):
    """The witness's submission prefix: an http(s) URL of at most URL_MAX characters that the
    outbound-address guard lets through; kept without its trailing slashes."""

    def run_validation(self, data: Any = serializers.empty) -> Any:
        if not isinstance(data, str) or len(data) > URL_MAX:
            raise _invalid(
                "url", f"the witness's submission prefix, an http(s) URL of at most {URL_MAX} characters"
            )
        try:
            URLValidator(schemes=["http", "https"])(data)
        except ValidationError:
            raise _invalid("url", "the witness's submission prefix, an http(s) URL") from None
        unsafe = outbound.check_url(data)
        if unsafe:
            raise _invalid("url", unsafe, "unsafe_url")
        return data.rstrip("/")


class _Vkey(serializers.CharField):
    """A C2SP cosigner verifier key (name+keyid+base64), kept stripped."""

    def run_validation(self, data: Any = serializers.empty) -> Any:
        if not isinstance(data, str) or len(data) > VKEY_MAX:
            raise _invalid("vkey", "a C2SP cosigner verifier key (name+keyid+base64)")
        try:
            cosignature.parse_cosigner_vkey(data.strip())
        except note.NoteError as exc:
            raise _invalid("vkey", f"not a cosigner vkey (Ed25519 0x04 or ML-DSA-44 0x06): {exc}") from None
        return data.strip()


class WitnessAdd(Input[NewWitness]):
    """A new witness `{"name", "url", "vkey"}`; a field missing is refused like a wrong one."""

    command = NewWitness
    MISSING_IS_WRONG = True

    name = Text(
        code="invalid",
        message="name: 1-64 letters, digits, '.', '_' or '-' (not 'none' or 'witnesses')",
        max_length=64,
        valid=lambda name: bool(NAME.match(name)) and name not in ("none", "witnesses"),
    )
    url = _Url(max_length=URL_MAX)
    vkey = _Vkey(max_length=VKEY_MAX)


class QuorumSet(Input[Quorum]):
    """`{"quorum": k}`: k at most the number of witnesses (the service checks that)."""

    command = Quorum

    quorum = Whole(
        code="invalid", message="quorum: a whole number from 0 to the number of witnesses", min_value=0
    )
