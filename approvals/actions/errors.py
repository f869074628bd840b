"""The error every approvals action refuses with."""

from __future__ import annotations

from controlplane.errors import DomainError


class ApprovalError(DomainError):
    """A refused change, with a machine-readable code and the field at fault."""

    def __init__(self, code: str, detail: str, *, status: int = 400, field: str | None = None) -> None:
        if field is None:
            super().__init__(status, code, detail)
        else:
            super().__init__(status, code, detail, field=field)
