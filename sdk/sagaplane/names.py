"""How the gate compares the names a caller chooses (tool names, agent names, tags) with the names
and globs its halts, budgets, rate limits and approval policies were written with: case-insensitively
after Unicode NFKC normalisation, by these functions on both sides (the control plane's gate and
approvals, and the SDK's local view of halts and governed tools).

A caller picks its tool's name, so a match it could dodge by case (`HALTED.x` past
`tool:halted.*`) or by look-alikes (fullwidth `ＡＭＴ.PAY` past `amt.*`) would be a hole. Only the
comparison folds: every name and glob is stored and shown as it was sent.
"""

from __future__ import annotations

import fnmatch
import unicodedata
from functools import lru_cache


@lru_cache(maxsize=8192)
def name_key(name: str) -> str:
    """`name` as the gate compares it: NFKC, case-folded, NFKC again (case folding can undo the
    normal form: Unicode's NFKC_Casefold, as far as the standard library spells it)."""
    return unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", name).casefold())


def glob_matches(pattern: str, name: str) -> bool:
    """Whether `name` matches the glob `pattern`, both folded by `name_key` (`*`, `?`, `[...]`;
    fnmatchcase, so no platform folds anything further)."""
    return fnmatch.fnmatchcase(name_key(name), name_key(pattern))


def same_name(a: str, b: str) -> bool:
    return name_key(a) == name_key(b)
