"""One error shape on every API route (issue 9, defect 7; issue 10, item 4): every `/api/` and
`/v1/` answer that is not 2xx is JSON `{"error", "detail", ...}`, whoever produced it, and the
OpenAPI schema documents the error answers of every operation."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest
from django.db import OperationalError
from django.test import Client
from drf_spectacular.generators import SchemaGenerator
from rest_framework.test import APIClient

from audit.services import IngestRefused
from core import availability
from core.errors import DomainError, api_exception_handler, flatten_errors
from sagas import api as sagas_api
from tests.support.factories import Person
from tests.support.waiting import wait_until
from transparency.bundles import BundleUnavailable
from transparency.services import IntegrationRefused


def _shape(response: Any) -> dict[str, Any]:
    assert response["Content-Type"].startswith("application/json"), (response.status_code, response.content)
    body = response.json()
    assert isinstance(body.get("error"), str) and body["error"], body
    assert isinstance(body.get("detail"), str) and body["detail"], body
    return body


@pytest.mark.parametrize(
    "url", ["/api/v1/nope", "/api/nope", "/v1/nope", "/api/v1/sagas/x/y/z", "/api/v1/keys/"]
)
@pytest.mark.parametrize("method", ["get", "post", "delete"])
def test_an_unknown_api_route_is_a_json_404(alice: Person, url: str, method: str) -> None:
    response = getattr(alice.key_client(), method)(url)
    assert response.status_code == 404
    assert _shape(response)["error"] == "not_found"


def test_a_missing_object_is_a_404_in_the_shape(alice: Person) -> None:
    # get_object_or_404 raises Django's Http404, which DRF answers as {"detail": ...} on its own.
    response = alice.session_client().get("/api/v1/keys/987654321")
    assert response.status_code == 404
    assert _shape(response)["error"] == "not_found"


def test_an_unknown_page_is_still_an_html_404(db: None) -> None:
    response = Client().get("/no-such-page/")
    assert response.status_code == 404
    assert not response["Content-Type"].startswith("application/json")


def test_an_unhandled_error_is_a_json_500_that_leaks_nothing(
    alice: Person, monkeypatch: pytest.MonkeyPatch
) -> None:
    def explode(self: Any) -> Any:
        raise RuntimeError("secret internals: password=hunter2")

    monkeypatch.setattr(sagas_api.SagaListView, "get_queryset", explode)
    client = APIClient(raise_request_exception=False)
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {alice.api_key}")
    response = client.get("/api/v1/sagas")
    assert response.status_code == 500
    body = _shape(response)
    assert body["error"] == "server_error"
    assert "hunter2" not in response.content.decode()


def test_a_database_outage_is_a_503_refusal_and_later_calls_are_refused_at_once(
    alice: Person, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Any API view that meets an unreachable database answers `503 control_plane_unavailable`
    with Retry-After, not a 500; until the store's probe reaches it again, the next calls are
    refused before they wait on it (as the gate's are: core/availability.py)."""
    reachable = threading.Event()

    def probe() -> None:
        if not reachable.is_set():
            raise psycopg.OperationalError("still unreachable")

    def cut(self: Any) -> Any:
        raise OperationalError("the connection was lost") from psycopg.OperationalError("server closed")

    monkeypatch.setitem(availability._PROBES, availability.DATABASE, probe)
    client = APIClient(raise_request_exception=False)
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {alice.api_key}")
    with monkeypatch.context() as outage:
        outage.setattr(sagas_api.SagaListView, "get_queryset", cut)
        met = client.get("/api/v1/sagas")
    assert met.status_code == 503 and met["Retry-After"] == "1"
    assert _shape(met)["error"] == "control_plane_unavailable"
    assert "decision" not in met.json()  # not a gate call: nothing was asked to be allowed
    refused = client.get("/api/v1/sagas")  # the view is whole again; the store is still down
    assert (refused.status_code, refused.json()) == (503, met.json())
    reachable.set()
    wait_until(lambda: not availability.is_down(availability.DATABASE), "the probe to reach the database")
    assert client.get("/api/v1/sagas").status_code == 200


def test_validation_errors_name_their_field_without_python_reprs(alice: Person) -> None:
    # A DRF serializer's refusal (a redaction's body); nested paths: test_flatten_errors_gives_dotted_paths.
    response = alice.session_client().post(
        "/api/v1/audit/redactions", {"stream": "s", "position": "first", "reason": "r"}, format="json"
    )
    assert response.status_code == 400
    body = _shape(response)
    text = response.content.decode()
    assert "ErrorDetail" not in text and "{1:" not in text
    assert body["error"] == "invalid"
    assert body["field"] == "position"
    assert body["detail"].startswith("position: ")
    assert list(body["fields"]) == ["position"]


def test_a_typed_input_names_the_list_at_fault(alice: Person) -> None:
    response = alice.session_client().post(
        "/api/v1/keys", {"name": "k", "scopes": ["read", "bogus"]}, format="json"
    )
    assert response.status_code == 400
    assert "ErrorDetail" not in response.content.decode()
    assert (_shape(response)["error"], _shape(response)["field"]) == ("invalid_scope", "scopes")


def test_flatten_errors_gives_dotted_paths() -> None:
    nested = {"a": {"b": ["bad"]}, "c": {0: ["no"], 2: ["nope"]}, "d": [{}, {"e": ["x"]}], "f": ["plain"]}
    assert flatten_errors(nested) == {
        "a.b": ["bad"],
        "c.0": ["no"],
        "c.2": ["nope"],
        "d.1.e": ["x"],
        "f": ["plain"],
    }
    assert flatten_errors(["whole"]) == {"non_field_errors": ["whole"]}


@pytest.mark.parametrize(
    ("request_kwargs", "status", "code"),
    [
        ({"path": "/api/v1/sagas", "method": "delete"}, 405, "method_not_allowed"),
        (
            {"path": "/api/v1/keys", "method": "post", "data": "x", "content_type": "text/plain"},
            415,
            "unsupported_media_type",
        ),
        (
            {"path": "/api/v1/keys", "method": "post", "data": "{", "content_type": "application/json"},
            400,
            "malformed_json",
        ),
    ],
)
def test_drf_refusals_carry_an_error_code(
    alice: Person, request_kwargs: dict[str, Any], status: int, code: str
) -> None:
    kwargs = dict(request_kwargs)
    method = kwargs.pop("method")
    path = kwargs.pop("path")
    response = getattr(alice.session_client(), method)(path, **kwargs)
    assert response.status_code == status
    assert _shape(response)["error"] == code


def test_anonymous_and_wrong_scope_answers_carry_an_error_code(alice: Person) -> None:
    assert _shape(APIClient().get("/api/v1/sagas"))["error"] == "not_authenticated"
    # A key may not manage keys: a signed-in owner's capability, never a key's.
    assert _shape(alice.key_client().get("/api/v1/keys"))["error"]


@pytest.mark.parametrize(
    ("error", "status", "body"),
    [
        (
            IngestRefused("broken_link", "record 3 does not link", status=422, seq=3, index=2),
            422,
            {
                "error": "chain_broken",
                "detail": "record 3 does not link",
                "seq": 3,
                "index": 2,
                "reason": "broken_link",
            },
        ),
        (
            IngestRefused("equivocation", "seq 3 is held with another hash", status=409, seq=3, index=0),
            409,
            {
                "error": "equivocation",
                "detail": "seq 3 is held with another hash",
                "seq": 3,
                "index": 0,
                "reason": "equivocation",
            },
        ),
        (
            IngestRefused("invalid", "records[0].seq: required", field="records[0].seq", index=0),
            400,
            {"error": "invalid", "detail": "records[0].seq: required", "field": "records[0].seq"},
        ),
        (
            DomainError(
                "invitation_used", "this invitation has already been used", status=410, field="token"
            ),
            410,
            {"error": "invitation_used", "detail": "this invitation has already been used", "field": "token"},
        ),
        (
            DomainError("last_owner", "keep one", status=409, field="role"),
            409,
            {"error": "last_owner", "detail": "keep one", "field": "role"},
        ),
        (
            DomainError("not_found", "index: beyond the tree", status=404, field="index"),
            404,
            {"error": "not_found", "detail": "index: beyond the tree", "field": "index"},
        ),
        (
            DomainError("invalid", "first: too big", field="first"),
            400,
            {"error": "invalid", "detail": "first: too big", "field": "first"},
        ),
        (
            BundleUnavailable("not_sealed", "no seal yet", status=409),
            409,
            {"error": "not_sealed", "detail": "no seal yet"},
        ),
        (
            IntegrationRefused("integration_refused", "the log shrank", status=500),
            500,
            {"error": "integration_refused", "detail": "the log shrank"},
        ),
        (
            DomainError("too_large", "over", status=413, context={"limit": 5}),
            413,
            {"error": "too_large", "detail": "over", "limit": 5},
        ),
        (
            # A context field may be called `status` (an export's), beside the HTTP status.
            DomainError("not_ready", "the export is running", status=409, context={"status": "running"}),
            409,
            {"error": "not_ready", "detail": "the export is running", "status": "running"},
        ),
    ],
)
def test_every_domain_error_maps_to_its_status_and_shape_in_one_place(
    error: DomainError, status: int, body: dict[str, Any]
) -> None:
    response = api_exception_handler(error, {})
    assert response is not None
    assert (response.status_code, response.data) == (status, body)


def _schema() -> dict[str, Any]:
    return SchemaGenerator().get_schema(request=None, public=True)


def test_every_operation_documents_its_error_answers_in_the_error_shape(db: None) -> None:
    schema = _schema()
    error = schema["components"]["schemas"]["Error"]
    assert error["required"] == ["error", "detail"]
    operations = [
        (path, method, op)
        for path, ops in schema["paths"].items()
        for method, op in ops.items()
        if method in ("get", "post", "put", "patch", "delete")
    ]
    assert len(operations) > 20
    for path, method, op in operations:
        documented = op["responses"]
        for status in ("400", "401", "403", "404"):
            assert status in documented, (path, method, status)
        if "requestBody" in op:
            assert {"413", "415"} <= set(documented), (path, method)
        for status, response in documented.items():
            if status.startswith(("4", "5")):
                schema_ref = response["content"]["application/json"]["schema"]
                assert schema_ref.get("$ref", "").startswith("#/components/schemas/"), (path, method, status)
