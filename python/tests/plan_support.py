"""Plans measured in work, not time: the shared buffers a statement touches (EXPLAIN ANALYZE BUFFERS, nested
statements of the functions it calls included), so a slow machine passes and a plan that reads too much does not."""

from __future__ import annotations

import re
from typing import Any

import psycopg


def buffers(c: psycopg.Connection[Any], query: str, params: list[Any]) -> int:
    """Shared buffers the statement touched (EXPLAIN ANALYZE runs it for real)."""
    plan = "\n".join(r[0] for r in c.execute("EXPLAIN (ANALYZE, BUFFERS) " + query, params).fetchall())
    found = re.search(r"Buffers: shared hit=(\d+)(?: read=(\d+))?", plan)
    assert found, plan
    return int(found.group(1)) + int(found.group(2) or 0)
