"""Every transparency-dev/merkle conformance vector must verify exactly as ``wantErr`` says.

The vectors are vendored in ``tests/vectors/transparency-dev-merkle`` (origin and licence there).
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
from sagaplane.merkle import (
    ConsistencyProofError,
    InclusionProofError,
    verify_consistency,
    verify_inclusion,
)


def _vectors_root() -> Path:
    return Path(__file__).resolve().parents[1] / "vectors" / "transparency-dev-merkle" / "testdata"


def _collect(kind: str) -> list[Path]:
    # An empty parametrisation would be reported as a skip, so a missing folder is
    # turned into one case that fails loudly.
    folder = _vectors_root() / kind
    found = sorted(folder.rglob("*.json")) if folder.is_dir() else []
    return found or [folder / "MISSING.json"]


INCLUSION = _collect("inclusion")
CONSISTENCY = _collect("consistency")


def _b64(value: str) -> bytes:
    return base64.b64decode(value, validate=True)


def _load(path: Path) -> dict[str, Any]:
    assert path.is_file(), f"test vector missing: {path}"
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def _ids(paths: list[Path]) -> list[str]:
    root = _vectors_root()
    return [str(p.relative_to(root)) if p.is_relative_to(root) else str(p) for p in paths]


def test_vectors_present() -> None:
    root = _vectors_root()
    assert root.is_dir(), f"test vectors missing at {root}"
    # The vendored commit ships 98 files of each kind; fewer means a truncated copy that
    # would make the suite pass vacuously.
    assert len(INCLUSION) == 98, f"{len(INCLUSION)} inclusion vectors under {root}, expected 98"
    assert len(CONSISTENCY) == 98, f"{len(CONSISTENCY)} consistency vectors under {root}, expected 98"
    assert any(not _load(p)["wantErr"] for p in INCLUSION)
    assert any(not _load(p)["wantErr"] for p in CONSISTENCY)


@pytest.mark.parametrize("path", INCLUSION, ids=_ids(INCLUSION))
def test_inclusion_vector(path: Path) -> None:
    v = _load(path)
    args = (
        _b64(v["leafHash"]),
        v["leafIdx"],
        v["treeSize"],
        [_b64(p) for p in v["proof"] or []],
        _b64(v["root"]),
    )
    if v["wantErr"]:
        with pytest.raises(InclusionProofError):
            verify_inclusion(*args)
    else:
        assert verify_inclusion(*args) is None


@pytest.mark.parametrize("path", CONSISTENCY, ids=_ids(CONSISTENCY))
def test_consistency_vector(path: Path) -> None:
    v = _load(path)
    args = (
        v["size1"],
        v["size2"],
        [_b64(p) for p in v["proof"] or []],
        _b64(v["root1"]),
        _b64(v["root2"]),
    )
    if v["wantErr"]:
        with pytest.raises(ConsistencyProofError):
            verify_consistency(*args)
    else:
        assert verify_consistency(*args) is None
