"""What the evidence store's actions share: the refusal every one of them raises and the result of
an append."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from audit import queries
from audit.models import Record
from core.errors import DomainError


class IngestRefused(DomainError):
    """A refused batch (or erasure). `code` is the specific reason (digest_mismatch, broken_link,
    seq_gap, equivocation, forged_gap, invalid, ...); `error` the API's top-level error code."""

    def __init__(
        self,
        code: str,
        detail: str,
        *,
        status: int = 400,
        field: str | None = None,
        seq: Any = None,
        index: int | None = None,
        context: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(code, detail, status=status, field=field, context=context)
        self.seq = seq
        self.index = index

    @property
    def error(self) -> str:
        return "chain_broken" if self.status == 422 else self.code

    def context(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.extra)
        if self.status in (409, 422):
            out.update(seq=self.seq, index=self.index, reason=self.code)
        if self.field is not None:
            out["field"] = self.field
        return out


@dataclass
class IngestResult:
    stream_id: str
    accepted: int
    duplicates: int
    head_seq: int | None
    head_hash: str
    rows: list[queries.StoredRow] = field(default_factory=list)

    @property
    def records(self) -> list[Record]:
        """The appended headers as model instances (built on demand: the hot path never needs them)."""
        return [row.as_record() for row in self.rows]

    def as_dict(self) -> dict[str, Any]:
        return {
            "stream": self.stream_id,
            "accepted": self.accepted,
            "duplicates": self.duplicates,
            "head": {"seq": self.head_seq, "hash": self.head_hash},
        }
