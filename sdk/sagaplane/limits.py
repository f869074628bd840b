"""Limits a record must keep so that every reader (the control plane, its pages, agent-saga) can
take it. The writer refuses a record past them before it reaches the WAL, and the control plane
refuses the same records with a 400, so a WAL never holds what the server will not store.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

# A record's values nest at most this deep, the record object itself counting as level 1
# (`{"kwargs": {"a": [1]}}` is 3 levels). Readers recurse over records; 64 is far beyond what a
# tool call needs and far below Python's recursion limit.
MAX_NESTING = 64


def nesting_depth(value: Any, stop_after: int = MAX_NESTING) -> int:
    """How many levels of dicts and lists `value` nests (0 for a scalar), counted without
    recursion; stops counting (and returns `stop_after + 1`) once it passes `stop_after`."""
    deepest = 0
    pending: list[tuple[Any, int]] = [(value, 1)]
    while pending:
        item, level = pending.pop()
        children: Iterable[Any]
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        if level > deepest:
            deepest = level
            if deepest > stop_after:
                return deepest
        pending.extend((child, level + 1) for child in children if isinstance(child, dict | list | tuple))
    return deepest


__all__ = ["MAX_NESTING", "nesting_depth"]
