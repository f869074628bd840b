"""Property-based fuzz of ingest (issue 9): records with arbitrary unicode (NUL, lone surrogates,
any plane), numbers (NaN, +-Infinity, huge ints, any float), nesting around the limit and sizes
up to a few KB. Each batch is either stored and served back exactly -- by the store, the saga API,
the disclosure (verified offline by the SDK) and the export -- or refused with a 4xx that leaves
the store unchanged. Never a 5xx. A batch built within the documented limits must be stored.

Runs on Postgres (which refuses NUL in text and jsonb, and NaN in jsonb) and on SQLite."""

from __future__ import annotations

import io
import json
import re
import uuid
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from sagaplane.chain import redact_record, stamp, verify_chain
from sagaplane.disclosure import verify_disclosure
from sagaplane.limits import MAX_NESTING

from audit.jsonvalues import index_text
from audit.models import Record, RecordPayload, Redaction
from audit.services import stored_record
from core.scoping import tenant_context
from sagas.services import mask_credentials
from tenants.models import Tenant
from tests.support.chains import T0, snapshot
from tests.support.factories import Person
from tests.support.scoping import in_tenant
from tests.support.transparency import settle
from transparency import bundles

URL = "/api/v1/streams/{}/records"
_SURROGATE = re.compile("[\ud800-\udfff]")

# Text from every plane, surrogates included (hypothesis leaves category Cs out by default),
# with NUL and lone surrogates often enough to matter.
any_text = st.one_of(
    st.text(st.characters(exclude_categories=()), max_size=12),
    st.sampled_from(["", "\x00", "a\x00b", "\ud800", "x\udfff", "\U0001f600", "\u2028", "NaN", "\\u0000"]),
)
numbers = st.one_of(
    st.integers(),
    st.sampled_from([2**63, -(2**200), 10**300, 0, -1]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([float("nan"), float("inf"), float("-inf"), -0.0, 1e308, 5e-324]),
)
scalars = st.one_of(st.none(), st.booleans(), numbers, any_text)
json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(any_text, inner, max_size=4)),
    max_leaves=24,
)


def nested(levels: int, leaf: Any) -> Any:
    for _ in range(levels):
        leaf = [leaf]
    return leaf


# Nesting around the limit: the record is level 1, so kwargs (level 2) may nest 63 more.
deep_values = st.builds(nested, st.integers(MAX_NESTING - 3, MAX_NESTING + 2), scalars)


# Names the batch sets itself (header, chain fields, the ids): other business fields are fuzzed.
TAKEN = {"seq", "ts", "event", "_h", "_ph", "_cd", "_s", "_redacted", "saga_id", "step_id", "tool", "kwargs"}


@dataclass
class Batch:
    records: list[dict[str, Any]]
    saga_id: str
    within_limits: bool  # built only from what the chain rule and the documented limits accept


def _has_surrogate(value: Any) -> bool:
    return bool(_SURROGATE.search(json.dumps(value, ensure_ascii=False, allow_nan=True)))


def _depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    return 0


def _chain(bodies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chain the bodies as agent-saga does. A body the chain cannot hash (a lone surrogate) gets
    the hashes of a cleaned copy, so it is sent and must be refused."""
    out, prev = [], "0" * 64
    for n, body in enumerate(bodies, 1):
        record = {"seq": n, "event": body.pop("event"), "ts": T0 + n / 1000, **body}
        try:
            prev = stamp(record, prev)
        except UnicodeEncodeError:
            clean = json.loads(_SURROGATE.sub("?", json.dumps(record, ensure_ascii=False)))
            prev = stamp(clean, prev)
            record.update({k: clean[k] for k in ("_s", "_cd", "_ph", "_h")})
        out.append(record)
    return out


@st.composite
def batches(draw: st.DrawFn) -> Batch:
    saga_id = uuid.uuid4().hex[:12] + draw(any_text)
    name, tool, step_id = draw(any_text), draw(any_text), draw(any_text)
    event = draw(st.one_of(st.just("STEP_INTENT"), any_text.filter(lambda e: 0 < len(e) <= 64)))
    kwargs = draw(st.one_of(json_values, deep_values))
    extra = draw(st.dictionaries(any_text.filter(lambda k: k not in TAKEN), scalars, max_size=3))
    bodies = [
        {"event": "SAGA_START", "saga_id": saga_id, "name": name, "lease_ttl": draw(numbers)},
        {"event": event, "saga_id": saga_id, "step_id": step_id, "tool": tool, "kwargs": kwargs, **extra},
        {"event": "STEP_COMMITTED", "saga_id": saga_id, "step_id": step_id, "tool": tool},
        {"event": "SAGA_COMPLETE", "saga_id": saga_id},
    ]
    records = _chain(bodies)
    reason = draw(st.one_of(st.none(), any_text.filter(bool)))
    if reason is not None:  # the committed step erased before shipping: a stub outside the hash
        records[2] = redact_record(records[2], reason=reason)
    within = (
        not any(_has_surrogate(r) for r in records)
        and max(_depth(r) for r in records) <= MAX_NESTING
        and len(saga_id) <= 128
        and len(step_id) <= 128
        and len(tool) <= 200
        and len(reason or "") <= 200
    )
    return Batch(records, saga_id, within)


def same(a: Any, b: Any) -> bool:
    """Equal as JSON values: NaN equals NaN, 1 and 1.0 differ, key order does not matter."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def served(entry: dict[str, Any]) -> Any:
    return json.loads(entry["record_json"]) if "record_json" in entry else entry["record"]


def strict(content: bytes) -> Any:
    def refuse(token: str) -> None:
        raise AssertionError(f"response is not strict JSON: {token}")

    return json.loads(content, parse_constant=refuse)


def _stored_leaves(tenant: Tenant, stream: str) -> list[tuple[int, dict[str, Any]]]:
    with tenant_context(tenant):
        rows = list(Record.objects.filter(stream__stream_id=stream).order_by("position"))
        payloads = {p.record_id: p for p in RecordPayload.objects.filter(record__in=rows)}
        erased = dict(Redaction.objects.filter(record__in=rows).values_list("record_id", "reason"))
        return [(r.leaf_index, stored_record(r, payloads.get(r.pk), erased.get(r.pk))) for r in rows]


def _exported(tenant: Tenant, first: int, end: int) -> list[dict[str, Any]]:
    out = io.BytesIO()
    bundles.write_records(
        first,
        end,
        out,
        lambda done: None,
        lambda start, stop: in_tenant(bundles.records_chunk, tenant, start, stop),
    )
    return [json.loads(line)["record"] for line in out.getvalue().splitlines()]


def check_batch(person: Person, batch: Batch, key: str) -> None:
    tenant = person.tenant
    stream = "fz-" + uuid.uuid4().hex
    before = snapshot(tenant)
    body = json.dumps({"records": batch.records})  # NaN/Infinity as bare tokens, like agent-saga
    response = person.key_client().post(URL.format(stream), body, content_type="application/json")
    assert response.status_code < 500, response.content
    event(f"answer {response.status_code} {response.json().get('error', '')}")
    if response.status_code != 200:
        assert 400 <= response.status_code < 500
        assert set(strict(response.content)) >= {"error", "detail"}
        assert snapshot(tenant) == before, "a refused batch changed the store"
        assert not batch.within_limits, f"refused a batch within the limits: {response.content!r}"
        return
    sent = batch.records
    assert verify_chain(sent).intact  # only what verifies may be stored

    leaves = _stored_leaves(tenant, stream)
    assert [same(record, s) for (_, record), s in zip(leaves, sent, strict=True)] == [True] * len(sent)
    exported = _exported(tenant, leaves[0][0], leaves[-1][0] + 1)
    assert [same(r, s) for r, s in zip(exported, sent, strict=True)] == [True] * len(sent)

    in_saga = [r for r in sent if "_redacted" not in r]  # a stub carries no saga_id
    index_id = index_text(batch.saga_id)
    if "/" not in index_id:
        detail = person.key_client().get("/api/v1/sagas/" + quote(index_id, safe=""))
        assert detail.status_code == 200, detail.content
        records = [served(e) for e in strict(detail.content)["records"]]
        # The saga API shows credential-like values as references; everything else as sent.
        shown = {"seq", "ts", "event"}
        masked = [
            {k: v if k.startswith("_") or k in shown else mask_credentials(v, k) for k, v in r.items()}
            for r in in_saga
        ]
        assert [same(r, s) for r, s in zip(records, masked, strict=True)] == [True] * len(in_saga)

        settle(tenant)
        disclosure = person.key_client().get(f"/api/v1/audit/sagas/{quote(index_id, safe='')}/disclosure")
        assert disclosure.status_code == 200, disclosure.content
        bundle = strict(disclosure.content)
        assert bundle["saga_id"] == batch.saga_id
        disclosed = [served(e) for e in bundle["records"]]
        assert [same(r, s) for r, s in zip(disclosed, in_saga, strict=True)] == [True] * len(in_saga)
        assert verify_disclosure(bundle, key).records == len(in_saga)


FUZZ = settings(
    max_examples=50,
    deadline=None,
    database=None,  # no example files written into the tree
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,  # one tenant for every example; each uses a new stream
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)


def _key(person: Person) -> str:
    response = person.key_client().get("/api/v1/audit/key")
    if response.status_code == 404:  # no signing key until the first checkpoint
        settle(person.tenant)
        response = person.key_client().get("/api/v1/audit/key")
    return response.content.decode().splitlines()[0]


# Not marked postgres: `make test` runs it on Postgres, then again on SQLite with the rest.
@FUZZ
@given(batch=batches())
def test_ingest_fuzz(alice: Person, batch: Batch) -> None:
    check_batch(alice, batch, _key(alice))
