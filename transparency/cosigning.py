"""Collecting cosignatures: one pass sends the tenant's latest signed checkpoint to every witness
that has not cosigned it (C2SP tlog-witness `POST <prefix>/add-checkpoint`), each with the
consistency proof from the size that witness last cosigned; a 409 names that size, and the
request is made again from there (at most twice).

A pass (`transparency.tasks.cosign_pass`) reads the database, talks to the witnesses with no
transaction open (in parallel, each with a short timeout), then records each answer in a short
transaction of its own. It never touches the tree state or the signing path: a witness that is
down or refuses costs this task its timeout and nothing else, and is backed off (1 s doubling to
a minute) so a dead one is not asked on every checkpoint. What a witness refuses is kept
(`WitnessRefusal`): a 422 from one that cosigned before is a split view caught."""

from __future__ import annotations

import base64
import logging
from dataclasses import dataclass, replace
from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone
from sagaplane import cosignature, note

from core import outbound
from core.numbers import ascii_int
from core.scoping import require_tenant
from tenants.models import Tenant
from transparency import proofs
from transparency.models import Checkpoint, Cosignature, Witness, WitnessRefusal

log = logging.getLogger(__name__)

SIZE_CONTENT_TYPE = "text/x.tlog.size"
MAX_BACKOFF_S = 60.0
USER_AGENT = "sagaplane-cosigner"


@dataclass(frozen=True)
class Job:
    """One request to one witness, with everything it needs read before any request is made."""

    witness_id: int
    name: str
    url: str
    vkey: str
    old: int
    proof: list[bytes]  # from `old` to the checkpoint's size
    checkpoint_id: int
    size: int
    note: str


@dataclass(frozen=True)
class Outcome:
    job: Job
    status: int  # 200, a refusal's status, 0: unreachable
    line: str = ""  # the verified cosignature line (200)
    timestamp: int = 0
    detail: str = ""
    told: int | None = None  # a 409's size


def _timeout() -> float:
    return float(getattr(settings, "SAGAPLANE_WITNESS_TIMEOUT_S", 5.0))


def _proof(old: int, size: int) -> list[bytes]:
    return proofs.consistency(old, size)[1] if 0 < old < size else []


def plan(tenant: Tenant) -> list[Job]:
    """The requests this pass makes: the latest checkpoint to each witness that is due and has
    not cosigned it."""
    require_tenant(tenant)
    latest = Checkpoint.objects.order_by("-id").first()
    if latest is None:
        return []
    due = Witness.objects.filter(next_attempt_at__lte=timezone.now()).exclude(cosigned_checkpoint=latest)
    jobs = []
    for w in due:
        # A witness that says it cosigned more than was ever signed is asked from 0 (it says so again).
        old = w.cosigned_size if w.cosigned_size is not None and w.cosigned_size <= latest.size else 0
        proof = _proof(old, latest.size)
        jobs.append(Job(w.pk, w.name, w.url, w.vkey, old, proof, latest.pk, latest.size, latest.note))
    return jobs


def _body(old: int, proof: list[bytes], checkpoint_note: str) -> bytes:
    lines = "".join(base64.b64encode(h).decode() + "\n" for h in proof)
    return f"old {old}\n{lines}\n{checkpoint_note}".encode()


def _post(url: str, body: bytes) -> tuple[int, str, str]:
    connection, path = outbound.pinned_connection(url + "/add-checkpoint", _timeout())
    try:
        connection.request(
            "POST", path, body=body, headers={"Content-Type": "text/plain", "User-Agent": USER_AGENT}
        )
        response = connection.getresponse()
        return (
            response.status,
            response.getheader("Content-Type", ""),
            response.read(64 * 1024).decode("utf-8", "replace"),
        )
    finally:
        connection.close()


def _verify(job: Job, answer: str) -> tuple[str, int]:
    """The witness's cosignature line for the checkpoint in its 200 answer, verified."""
    key = cosignature.parse_cosigner_vkey(job.vkey)
    text = note.parse_note(job.note).text
    for line in answer.splitlines(keepends=True):
        if not line.startswith("\u2014 "):
            continue
        sig = note.parse_note(text + "\n" + line).signatures[0]
        if (sig.name, sig.key_id) == (key.name, key.key_id):
            return line, key.verify(text, sig.signature)
    raise note.SignatureError("no cosignature by the configured key in the answer")


def ask(job: Job) -> Outcome:
    """One add-checkpoint request and what its answer means."""
    try:
        status, content_type, text = _post(job.url, _body(job.old, job.proof, job.note))
    except (OSError, ValueError) as exc:  # unreachable, refused by the guard, not HTTP
        return Outcome(job, 0, detail=str(exc)[:500])
    if status == 200:
        try:
            line, timestamp = _verify(job, text)
        except (note.NoteError, ValueError) as exc:
            return Outcome(job, 200, detail=f"answered 200 without a valid cosignature: {exc}")
        return Outcome(job, 200, line, timestamp)
    told = ascii_int(text.strip(), max_digits=19)
    if status == 409 and content_type.startswith(SIZE_CONTENT_TYPE) and told is not None:
        return Outcome(job, 409, detail=text[:500], told=told)
    return Outcome(job, status, detail=text[:500])


def record(tenant: Tenant, outcome: Outcome) -> None:
    """Store one answer: the cosignature and the witness's new size, or the refusal and a backoff."""
    job, now = outcome.job, timezone.now()
    require_tenant(tenant)
    with transaction.atomic():
        witness = Witness.objects.select_for_update().filter(pk=job.witness_id).first()
        if witness is None or witness.vkey != job.vkey or witness.url != job.url:
            return  # removed or changed meanwhile: this answer is not about it any more
        if outcome.status == 200 and outcome.line:
            try:
                with transaction.atomic():
                    Cosignature.objects.create(
                        tenant=tenant,
                        checkpoint_id=job.checkpoint_id,
                        witness=witness,
                        witness_name=witness.name,
                        line=outcome.line,
                        timestamp=outcome.timestamp,
                    )
            except IntegrityError:
                pass  # another pass stored it first
            if witness.cosigned_size is None or witness.cosigned_size <= job.size:
                witness.cosigned_size = job.size
                witness.cosigned_checkpoint_id = job.checkpoint_id
                witness.cosigned_at = now
            witness.failures, witness.next_attempt_at = 0, now
            witness.last_status, witness.last_error = 200, ""
        else:
            if outcome.told is not None:
                witness.cosigned_size = outcome.told  # ask from there next time
            WitnessRefusal.objects.create(
                tenant=tenant,
                witness=witness,
                witness_name=witness.name,
                checkpoint_id=job.checkpoint_id,
                size=job.size,
                status=outcome.status,
                detail=outcome.detail,
            )
            witness.failures += 1
            witness.next_attempt_at = now + timedelta(
                seconds=min(MAX_BACKOFF_S, 2.0 ** (witness.failures - 1))
            )
            witness.last_status, witness.last_error = outcome.status, outcome.detail
            if outcome.status == 422:
                log.critical(
                    "witness %s refused tenant %s's checkpoint of size %s as inconsistent: %s",
                    witness.name,
                    tenant.slug,
                    job.size,
                    outcome.detail,
                )
        witness.save()


def asked_again(tenant: Tenant, job: Job, told: int) -> Job:
    """`job` again, from the size a witness's 409 `told` (at most the checkpoint's), with the
    consistency proof from there."""
    require_tenant(tenant)
    return replace(job, old=told, proof=_proof(told, job.size))
