"""The API's list pagination: DRF's limit/offset, bounded, so a client's `limit` or `offset` can
never reach the database as a number it cannot hold (10**24 was a Postgres bigint error, a 500)."""

from __future__ import annotations

from typing import Any

from rest_framework.pagination import LimitOffsetPagination

MAX_LIMIT = 500
# Far beyond any list's length (an empty page answers), far below Postgres' bigint.
MAX_OFFSET = 10**12


class BoundedLimitOffsetPagination(LimitOffsetPagination):
    max_limit = MAX_LIMIT

    def get_offset(self, request: Any) -> int:
        return min(super().get_offset(request), MAX_OFFSET)
