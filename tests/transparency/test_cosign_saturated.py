"""Cosigning that cannot starve (issue 26): with the Celery workers saturated (a flood of ingest
keeping integration and sealing busy, and CPU hogs on every core), the tenant's newest signed
checkpoint is still cosigned by its quorum of two real witnesses within a bounded time (each
witness's newest cosigned checkpoint reaches one signed under the flood).

The cosigning pass queued after each signed checkpoint waits behind the busy workers; the beat
process's own cosigner thread (transparency/cosigner.py) must find the witnesses behind and ask
them itself. Both deployment shapes, each with `worker -B --concurrency=2`: production's
(private Postgres and Redis, gunicorn) and `make run`'s (SQLite, the filesystem broker,
`runserver`). The witnesses are `sagaplane witness serve` processes on loopback, added and given
their quorum by the tenant's owner through the API, as a person would."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sagaplane import cosignature, note

from tests.hostile.production import OWNER_PASSWORD, sign_in
from tests.recovery.live import SATURATED_SHAPES, Deployment, saturated_deployment
from tests.sdk.witnesskit import RunningWitness, start_witness

API = "/api/v1/audit"
# Cosigning must not wait for the flood to end; the deadline only bounds a failing run.
COSIGN_DEADLINE = 90.0
EMBEDDED_OWNER_PASSWORD = "embedded-owner-password"  # embedded_deployment's tenant owner

pytestmark = pytest.mark.slow


@pytest.fixture(params=SATURATED_SHAPES)
def saturated(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Deployment]:
    with saturated_deployment(request.param, tmp_path) as live:
        yield live


def _text(live: Deployment, path: str) -> str:
    with live.client() as client:
        answer = client.get(path)
    return answer.text if answer.status_code == 200 else ""


def _size(checkpoint: str) -> int:
    return note.parse_checkpoint(note.parse_note(checkpoint).text).size


def _witnesses(live: Deployment, folder: Path) -> list[RunningWitness]:
    """Two witnesses trusting the tenant's log key, added by its owner with a quorum of two."""
    vkey = live.until(lambda: _text(live, f"{API}/key"), "the log's signing key").splitlines()[0]
    origin = note.parse_verifier_key(vkey).name
    running: list[RunningWitness] = []
    try:
        for i in (1, 2):
            running.append(start_witness(folder / f"w{i}", f"witness.test/w{i}", [(origin, vkey)]))
        password = OWNER_PASSWORD if live.cluster else EMBEDDED_OWNER_PASSWORD
        owner = sign_in(live.server, "owner@shop.example", password, tenant="shop")
        with httpx.Client(base_url=live.server.url, headers=owner, timeout=30) as session:
            for i, w in enumerate(running, start=1):
                body = {"name": f"w{i}", "url": w.url, "vkey": w.vkey}
                answer = session.post(f"{API}/witnesses", json=body)
                assert answer.status_code == 201, answer.text
            answer = session.put(f"{API}/witnesses/quorum", json={"quorum": 2})
            assert answer.status_code == 200, answer.text
    except BaseException:
        for w in running:
            w.stop()
        raise
    return running


def test_the_newest_checkpoint_is_cosigned_while_the_workers_are_saturated(
    saturated: Deployment, tmp_path: Path
) -> None:
    live = saturated
    running = _witnesses(live, tmp_path)
    try:
        keys = [cosignature.parse_cosigner_vkey(w.vkey) for w in running]
        # A checkpoint signed after the saturation began and the witnesses were added.
        before = _size(live.until(lambda: _text(live, f"{API}/checkpoint"), "a signed checkpoint"))
        signed = _size(
            live.until(
                lambda: (c := _text(live, f"{API}/checkpoint")) and _size(c) > before and c,
                "a checkpoint signed under the flood",
            )
        )

        def quorum_cosigned() -> str:
            # Each witness's newest cosigned checkpoint (not the log's newest checkpoint, which the
            # flood replaces every moment): both at or past `signed`, each with a valid
            # cosignature of that witness.
            with live.client() as client:
                answer = client.get(f"{API}/witnesses/checkpoints")
            if answer.status_code != 200:
                return ""
            newest = {entry["witness"]: entry for entry in answer.json()["witnesses"]}
            found = []
            for i, key in enumerate(keys, start=1):
                entry = newest.get(f"w{i}") or {}
                if not entry.get("checkpoint") or entry["size"] < signed:
                    return ""
                parsed = note.parse_note(entry["checkpoint"])
                if key not in cosignature.valid_cosignatures(parsed.text, parsed.signatures, [key]):
                    return ""
                found.append(entry["checkpoint"])
            return min(found, key=_size)

        cosigned = live.until(
            quorum_cosigned,
            f"a checkpoint of size >= {signed} cosigned by both witnesses under load",
            deadline=COSIGN_DEADLINE,
        )
        assert _size(cosigned) >= signed
        # The flood went on meanwhile: the log grew past what was cosigned (the workers stayed busy).
        live.until(
            lambda: (c := _text(live, f"{API}/checkpoint")) and _size(c) > _size(cosigned),
            "the flood's next checkpoint",
        )
    finally:
        for w in running:
            w.stop()
