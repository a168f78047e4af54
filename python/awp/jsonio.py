"""The gateway's JSON codec: compact UTF-8 answers (timestamps in ISO 8601 UTC, numerics as numbers), a strict
reader for request bodies (one object, no duplicate keys, no NaN/Infinity, no NUL), and the canonical hash of a
request that idempotency keys compare."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from decimal import Decimal
from typing import Any

from aiohttp import web


def json_default(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        if value.tzinfo is not None:
            value = value.astimezone(dt.UTC)
        return value.isoformat()
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


def dumps(value: Any) -> str:
    return json.dumps(value, default=json_default, ensure_ascii=False, separators=(",", ":"))


def json_response(value: Any, status: int = 200) -> web.Response:
    return web.Response(text=dumps(value), status=status, content_type="application/json")


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise ValueError("duplicate keys in an object")
    return obj


def has_nul(value: Any) -> bool:
    """PostgreSQL text cannot hold U+0000: find it anywhere in a parsed body."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            if "\x00" in v:
                return True
        elif isinstance(v, dict):
            for k, item in v.items():
                if "\x00" in k:
                    return True
                stack.append(item)
        elif isinstance(v, list):
            stack.extend(v)
    return False


def loads(data: bytes | str) -> Any:
    """Strict JSON: no NaN/Infinity, no duplicate keys in an object. Raises ValueError (or RecursionError)."""
    return json.loads(data, parse_constant=_no_constants, object_pairs_hook=_unique_keys)


def canonical_hash(value: Any) -> str:
    """SHA-256 of a canonical JSON encoding: the identity of a request for idempotency keys."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()
