"""Why the redaction's and the export's bodies are still DRF serializers of their own, not typed
inputs (issue 25, step 5; tests/controlplane/test_typed_inputs.py HAND_PARSED): their refusals
carry DRF's `fields` map of every field at fault (a typed input names the first only), DRF's
sentences, and DRF's coercion of a numeric string (a typed input's `Whole` refuses "5"). A
conversion must keep these answers first."""

from __future__ import annotations

from typing import Any

from tests.support.factories import Person


def _post(person: Person, url: str, body: Any) -> tuple[int, dict[str, Any]]:
    answer = person.session_client().post(url, body, format="json")
    return answer.status_code, answer.json()


def test_a_redaction_names_every_field_at_fault_in_drf_words(alice: Person) -> None:
    status, body = _post(
        alice, "/api/v1/audit/redactions", {"stream": "s", "position": "first", "reason": ""}
    )
    assert (status, body["field"], body["detail"]) == (
        400,
        "position",
        "position: A valid integer is required.",
    )
    assert body["fields"] == {
        "position": ["A valid integer is required."],
        "reason": ["This field may not be blank."],
    }


def test_a_redaction_takes_a_position_given_as_digits(alice: Person) -> None:
    status, body = _post(alice, "/api/v1/audit/redactions", {"stream": "s", "position": "5", "reason": "r"})
    assert body.get("field") != "position" and status != 400, body


def test_an_export_names_every_field_at_fault_and_takes_digits(alice: Person) -> None:
    status, body = _post(alice, "/api/v1/audit/exports", {"first": "x", "until": "soon"})
    assert (status, body["field"]) == (400, "first"), body
    assert list(body["fields"]) == ["first", "until"]
    status, body = _post(alice, "/api/v1/audit/exports", {"first": "2", "end": "1"})
    assert (status, body["detail"]) == (400, "first: must not be greater than end"), body
