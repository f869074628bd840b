"""Evidence page: checkpoint and verifier key, exports (start, progress fragment, download link)."""

from __future__ import annotations

import re

from django.test import Client
from django.urls import reverse

from core.scoping import tenant_context
from tests.support.factories import Person
from tests.support.sagadata import Writer, saga_forward, saga_rollback
from tests.support.scoping import in_tenant
from tests.support.transparency import settle
from transparency import services as transparency
from transparency.models import Export, ExportStatus
from transparency.tasks import build_export_in, integrate_fully


def browser(person: Person) -> Client:
    client = Client()
    client.force_login(person.user)
    return client


def _ship_and_sign(person: Person) -> str:
    writer = Writer()
    saga_id, records = saga_forward(writer)
    records += saga_rollback(writer, saga_id)
    response = person.key_client().post("/api/v1/streams/ev-1/records", {"records": records}, format="json")
    assert response.status_code == 200, response.content
    in_tenant(transparency.ensure_signing_key, person.tenant)
    integrate_fully(person.tenant)
    return saga_id


def test_refused_batches_are_listed_with_their_reasons(alice: Person, carol: Person) -> None:
    writer = Writer()
    _, records = saga_forward(writer)
    assert (
        alice.key_client()
        .post("/api/v1/streams/ev-2/records", {"records": records[:2]}, format="json")
        .status_code
        == 200
    )
    tampered = [dict(r) for r in records[2:]]
    tampered[0]["tool"] = "payments.steal"
    refused = alice.key_client().post("/api/v1/streams/ev-2/records", {"records": tampered}, format="json")
    assert refused.status_code == 422
    page = browser(alice).get(reverse("evidence")).content.decode()
    row = re.search(r'<tr data-stream="ev-2">.*?</tr>', page, re.S).group(0)
    assert "digest_mismatch" in row and f"seq {tampered[0]['seq']}" in row
    assert "digest_mismatch" not in browser(carol).get(reverse("evidence")).content.decode()


def test_no_checkpoint_yet(alice: Person) -> None:
    body = browser(alice).get(reverse("evidence")).content.decode()
    assert 'id="no-checkpoint"' in body and 'id="start-export" disabled' in body
    response = browser(alice).post(reverse("export-start"), follow=True)
    assert b"needs a signed checkpoint" in response.content
    with tenant_context(alice.tenant):
        assert not Export.objects.exists()


def test_checkpoint_key_and_export_flow(alice: Person) -> None:
    saga_id = _ship_and_sign(alice)
    client = browser(alice)
    body = client.get(reverse("evidence")).content.decode()
    assert re.search(r'id="checkpoint-size">\d+<', body)
    assert re.search(r'id="verifier-key">[^<+]+\+[0-9a-f]{8}\+[A-Za-z0-9+/=]+<', body)
    response = client.post(reverse("export-start"))
    assert response.status_code == 302
    with tenant_context(alice.tenant):
        export = Export.objects.get()
    assert export.requested_by == f"user:{alice.user.username}"
    fragment = client.get(reverse("export-status", args=[export.pk])).content.decode()
    assert 'data-poll-done="0"' in fragment and "<progress" in fragment
    build_export_in(alice.tenant, export.pk)
    with tenant_context(alice.tenant):
        assert Export.objects.get().status == ExportStatus.DONE
    fragment = client.get(reverse("export-status", args=[export.pk])).content.decode()
    download = f"/api/v1/audit/exports/{export.pk}/download"
    assert 'data-poll-done="1"' in fragment and download in fragment
    assert client.get(download).status_code == 200
    settle(alice.tenant)  # the sealer seals the finished saga: its disclosure is offered
    detail = client.get(reverse("saga-detail", args=[saga_id])).content.decode()
    disclosure = f"/api/v1/audit/sagas/{saga_id}/disclosure"
    assert disclosure in detail
    assert client.get(disclosure).status_code == 200


def test_viewer_and_other_tenant_cannot_use_exports(alice: Person, bob: Person, carol: Person) -> None:
    _ship_and_sign(alice)
    browser(alice).post(reverse("export-start"))
    with tenant_context(alice.tenant):
        export = Export.objects.get()
    assert browser(bob).post(reverse("export-start")).status_code == 403
    assert browser(bob).get(reverse("export-status", args=[export.pk])).status_code == 403
    assert browser(carol).get(reverse("export-status", args=[export.pk])).status_code == 404
    body = browser(carol).get(reverse("evidence")).content.decode()
    assert str(export.pk) not in body and "ev-1" not in body
