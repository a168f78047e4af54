"""Request parsing for the gateway's routes: bodies (size-limited, strict JSON), fields, path and query
parameters, and keyset paging; every malformed input is an :class:`awp.server.errors.ApiError` 400 (413 for a body
over its limit)."""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import re
from collections.abc import Callable
from typing import Any

from aiohttp import web

from awp.protocol.jsonio import RefusedJson, bad_text, dumps, json_default, loads
from awp.protocol.limits import BODY_LIMIT
from awp.server.errors import ApiError

INT32_MAX = 2**31 - 1


class BodyTimeout(web.RequestPayloadError):
    """The request body did not arrive within the body timeout (set on the body by :mod:`awp.server.middleware`)."""


def bad_request(message: str) -> ApiError:
    return ApiError.of(400, message)


def _malformed_body(exc: BaseException) -> ApiError:
    if isinstance(exc, BodyTimeout):
        return ApiError.of(408, str(exc))
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    lines = [line for line in lines if not re.fullmatch(r"\d{3}, message:?", line)]  # aiohttp's "400, message:"
    reason = lines[0].rstrip(":") if lines else "incomplete"
    return bad_request(f"the request body is malformed: {reason[:200]}")


def _too_large(limit: int) -> ApiError:
    return ApiError.of(413, f"the request body exceeds {limit} bytes")


async def read_body(request: web.Request, limit: int) -> bytes:
    """The raw body, at most ``limit`` bytes (413 beyond)."""
    length = request.content_length
    if length is not None and length > limit:
        raise _too_large(limit)
    data = bytearray()
    while True:
        try:
            chunk = await request.content.read(65536)
        except web.RequestPayloadError as e:  # bad chunked framing or content encoding
            raise _malformed_body(e) from None
        except ConnectionResetError:  # the client closed before the whole body came: nobody reads this answer
            raise bad_request("the request body is incomplete: the connection closed") from None
        if not chunk:
            broken = request.content.exception()  # framing that broke mid-body (awp.server.webserver)
            if broken is not None:
                raise _malformed_body(broken)
            return bytes(data)
        data += chunk
        if len(data) > limit:
            raise _too_large(limit)
        if request.content.at_eof() and request.content.exception() is None:
            return bytes(data)  # the whole body came in this chunk (the usual case): no read of b"" to tell


async def json_body(request: web.Request, limit: int = BODY_LIMIT, allow_empty: bool = False) -> dict[str, Any]:
    """Exactly one JSON object (``{}`` for an empty body when ``allow_empty``)."""
    data = await read_body(request, limit)
    if not data.strip():
        if allow_empty:
            return {}
        raise bad_request("the request body must be a JSON object")
    try:
        value = loads(data)
    except RefusedJson as e:
        raise bad_request(f"the request body is refused: {e}") from None
    except ValueError as e:  # UnicodeDecodeError too
        raise bad_request(f"the request body is not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise bad_request("the request body must be a JSON object")
    return value


def only_fields(body: dict[str, Any], required: tuple[str, ...] = (), optional: tuple[str, ...] = ()) -> None:
    unknown = sorted(set(body) - set(required) - set(optional))
    if unknown:
        raise bad_request(f"unknown fields: {', '.join(unknown)}")
    missing = [name for name in required if name not in body]
    if missing:
        raise bad_request(f"missing fields: {', '.join(missing)}")


def as_int(value: Any, name: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise bad_request(f"{name} must be an integer from {lo} to {hi}")
    return value


def progress_write(body: dict[str, Any], where: str = "") -> bool:
    """Check the fields of a progress write (docs/progress.md) in ``body``: logs and chunks arrays of strings, offset
    an integer of 0 or more; whether any of progress, logs and chunks is given. Sizes are the database's to check."""
    for name in ("logs", "chunks"):
        value = body.get(name)
        if value is not None and (not isinstance(value, list) or not all(isinstance(x, str) for x in value)):
            raise bad_request(f"{where}{name} must be an array of strings")
    if "offset" in body:
        as_int(body["offset"], f"{where}offset", 0, 2**62)
    return "progress" in body or body.get("logs") is not None or body.get("chunks") is not None


def as_str(value: Any, name: str, max_len: int = 1024) -> str:
    if not isinstance(value, str) or not 1 <= len(value) <= max_len:
        raise bad_request(f"{name} must be a string of 1-{max_len} characters")
    return value


def path_param(request: web.Request, name: str) -> str:
    value = request.match_info[name]
    if len(value) > 1024 or bad_text(value):
        raise ApiError.of(404, f"no such {name}")
    return value


def path_int(request: web.Request, name: str) -> int:
    value = request.match_info[name]
    if not value.isascii() or not value.isdigit() or not 1 <= int(value) <= INT32_MAX:
        raise bad_request(f"{name} must be a positive integer")
    return int(value)


def query_str(request: web.Request, name: str, max_len: int = 1024) -> str | None:
    value = request.query.get(name)
    if value is None or value == "":
        return None
    if len(value) > max_len or bad_text(value):
        raise bad_request(f"invalid {name}")
    return value


def query_int(request: web.Request, name: str, lo: int, hi: int, default: int) -> int:
    value = request.query.get(name)
    if value is None or value == "":
        return default
    if not value.isascii() or not value.isdigit() or not lo <= int(value) <= hi:
        raise bad_request(f"{name} must be an integer from {lo} to {hi}")
    return int(value)


def encode_cursor(key: str) -> str:
    return base64.urlsafe_b64encode(key.encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> str:
    try:
        key = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise bad_request("invalid cursor") from None
    if not key or bad_text(key) or encode_cursor(key) != cursor:
        raise bad_request("invalid cursor")
    return key


def page(items: list[Any], next_cursor: str | None = None) -> dict[str, Any]:
    return {"items": items, "next_cursor": next_cursor}


# Paging of list routes: ``limit`` (1-100, default 50) and an opaque ``cursor``: base64url of the JSON list of
# the sort key of the last row of the previous page (a whole keyset key, so a page follows its cursor while
# rows are added, and even when the cursor's row was pruned meanwhile). A malformed cursor is 400.
PAGE_LIMIT_MAX = 100
PAGE_LIMIT_DEFAULT = 50
LEGACY_RUN_CURSOR = re.compile(r"^run_[A-Za-z0-9]{1,64}$")


def page_limit(request: web.Request) -> int:
    return query_int(request, "limit", 1, PAGE_LIMIT_MAX, PAGE_LIMIT_DEFAULT)


def key_cursor(*values: Any) -> str:
    """The opaque cursor of a sort key."""
    return encode_cursor(dumps(list(values)))


def _key_value(value: Any, kind: str) -> Any:
    if kind == "int" and isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= INT32_MAX:
        return value
    if kind in ("str", "ts") and isinstance(value, str) and 1 <= len(value) <= 1024 and not bad_text(value):
        if kind == "str":
            return value
        try:
            stamp = dt.datetime.fromisoformat(value)
        except ValueError:
            pass
        else:
            if stamp.tzinfo is not None:
                return stamp.isoformat()  # the canonical form: PostgreSQL reads it whatever form Python accepted
    raise bad_request("invalid cursor")


def parse_key(raw: str, kinds: tuple[str, ...]) -> list[Any]:
    """The sort key in a decoded cursor: a JSON list of ``kinds`` ("str", "int", "ts"); 400 otherwise."""
    try:
        values = loads(raw)
    except ValueError:
        raise bad_request("invalid cursor") from None
    if not isinstance(values, list) or len(values) != len(kinds):
        raise bad_request("invalid cursor")
    return [_key_value(v, kind) for v, kind in zip(values, kinds, strict=True)]


def cursor_key(request: web.Request, *kinds: str) -> list[Any]:
    """The sort key of the ``cursor`` query parameter, or ``[None, ...]`` without one; 400 when malformed."""
    cursor = query_str(request, "cursor")
    if cursor is None:
        return [None] * len(kinds)
    return parse_key(decode_cursor(cursor), kinds)


def keyset_page(rows: list[dict[str, Any]], limit: int, key: Callable[[dict[str, Any]], list[Any]]) -> dict[str, Any]:
    """A page of ``limit`` rows from ``limit + 1`` fetched: next_cursor is the key of its last row, or null
    when nothing follows."""
    next_cursor = key_cursor(*key(rows[limit - 1])) if len(rows) > limit else None
    return page(rows[:limit], next_cursor)


def iso(value: Any) -> Any:
    return json_default(value) if isinstance(value, dt.datetime) else value
