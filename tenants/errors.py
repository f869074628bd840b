"""Moved to `controlplane.errors` (the one `DomainError` family and its mapping to responses).
Kept only so imports not yet updated keep working: import from `controlplane.errors`."""

from __future__ import annotations

from controlplane.errors import DomainError as ApiError
from controlplane.errors import api_exception_handler

__all__ = ["ApiError", "api_exception_handler"]
