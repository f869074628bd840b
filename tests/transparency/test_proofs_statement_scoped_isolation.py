"""The proof views run statement-scoped (no transaction; each statement carries its tenant: see
core.scoping.tenant_statements). Exercised here as production runs them, outside any test
transaction: a tenant gets its own log's answers, never a position or a node of another's, and a
third tenant with no log gets refusals, not data."""

from __future__ import annotations

import base64

import pytest
from django.db import connection

from tenants import founding
from tenants.actors import named_actor
from tenants.models import Role
from tests.support.chains import Writer
from tests.support.factories import PASSWORD, Person, make_person
from tests.support.transparency import settle

API = "/api/v1/audit"
pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def test_statement_scoped_proofs_answer_only_the_askers_log(
    alice: Person, carol: Person, writer_a: Writer, writer_b: Writer
) -> None:
    for n in range(4):
        writer_a.saga(f"a{n}", steps=3)
    writer_b.saga("b0")
    settle(alice.tenant)
    settle(carol.tenant)
    third = founding.create_tenant("third", "Third", "t@third.example", PASSWORD, actor=named_actor("test"))
    trent = make_person(third, "trent", Role.OWNER)
    assert not connection.in_atomic_block  # the views' own path: no transaction around them

    a, b, t = alice.key_client(), carol.key_client(), trent.key_client()
    a_size = a.get(f"{API}/proofs/inclusion", {"index": 0}).json()["size"]
    b_size = b.get(f"{API}/proofs/inclusion", {"index": 0}).json()["size"]
    assert a_size > b_size >= 1
    a_leaf = a.get(f"{API}/proofs/inclusion", {"index": 0}).json()["leaf_hash"]
    b_leaf = b.get(f"{API}/proofs/inclusion", {"index": 0}).json()["leaf_hash"]
    assert a_leaf != b_leaf

    # b asks for positions only a's log has, with and without a size: refused, naming the field.
    for params, field in [
        ({"index": a_size - 1}, "index"),
        ({"index": b_size, "size": a_size}, "size"),
        ({"index": 0, "size": a_size}, "size"),
    ]:
        response = b.get(f"{API}/proofs/inclusion", params)
        assert response.status_code == 400 and response.json()["field"] == field, (params, response.content)
    response = b.get(f"{API}/proofs/consistency", {"first": 1, "second": a_size})
    assert response.status_code == 400 and response.json()["field"] == "second"
    # a's answers did not leak into b's through the per-process latest-size hint either.
    assert b.get(f"{API}/proofs/inclusion", {"index": 0}).json()["size"] == b_size
    assert b.get(f"{API}/checkpoint").content != a.get(f"{API}/checkpoint").content

    # A third tenant with no log: no checkpoint, no proof, nothing of either log.
    assert t.get(f"{API}/checkpoint").status_code == 404
    for url, params in [
        ("proofs/inclusion", {"index": 0}),
        ("proofs/inclusion", {"index": 0, "size": a_size}),
        ("proofs/consistency", {"first": 1, "second": b_size}),
    ]:
        response = t.get(f"{API}/{url}", params)
        assert response.status_code == 400, (url, params, response.content)
        assert base64.b64encode(base64.b64decode(a_leaf)).decode() not in response.content.decode()
    # And no setting survives on the connection the views used.
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('sagaplane.tenant_id', true)")
        assert cursor.fetchone()[0] in ("", None)
