"""The HTTP gateway (python/awp/openapi.yaml): aiohttp routes only.

A handler authenticates, parses and validates, calls one SQL function (:class:`awp.db.Database`), and
shapes the answer. Errors are :class:`awp.errors.ApiError`; the middleware turns them (and database
errors, through the one table in :mod:`awp.errors`) into ``{"error": {code, message, request_id}}``,
stamps ``X-Request-Id`` on every response, logs one line per request and counts it.

Routes under ``/api/v1``; ``/health/live``, ``/health/ready`` and ``/metrics`` at the root.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import datetime as dt
import enum
import hashlib
import hmac
import json
import logging
import random
import re
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from decimal import Decimal
from importlib import resources
from typing import Any

import psycopg
import psycopg_pool
from aiohttp import web

from awp.coordinator import Coordinator
from awp.db import Database, DispatchListener
from awp.errors import SQLSTATE_ERRORS, ApiError, from_database_error, join_message
from awp.metrics import CONTENT_TYPE, Metrics

log = logging.getLogger(__name__)
access_log = logging.getLogger("awp.gateway.access")

API = "/api/v1"
PROTOCOL_HEADER = "X-Worker-Protocol-Version"
PROTOCOL_VERSION = "1"
BODY_LIMIT = 1024 * 1024  # 1 MiB
WORKFLOW_BODY_LIMIT = 16 * 1024 * 1024  # 16 MiB: a 10,000-task definition fits
MAX_WAIT_MS = 30_000
INT32_MAX = 2**31 - 1
RESULT_KINDS = ("success", "temporary_failure", "permanent_failure")
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


@dataclass(frozen=True)
class GatewayConfig:
    """Everything ``awp serve`` passes to the app."""

    database_url: str
    viewer_token: str
    operator_token: str
    bootstrap_token: str
    metrics_token: str | None = None
    pool_size: int = 10
    coordinator: bool = True
    coordinator_interval_ms: int = 1000
    claim_recheck_ms: int = 500
    retention_interval_ms: int | None = 5000  # background retention batches (None: off); docs/retention.md

    def check(self) -> None:
        """Raise ValueError when a secret is empty or two secrets are equal."""
        secrets = {
            "viewer": self.viewer_token,
            "operator": self.operator_token,
            "worker bootstrap": self.bootstrap_token,
        }
        for name, value in secrets.items():
            if not value or not value.strip():
                raise ValueError(f"the {name} token is empty")
        if len(set(secrets.values())) != len(secrets):
            raise ValueError("the viewer, operator and worker bootstrap tokens must all differ")
        if self.metrics_token is not None and not self.metrics_token.strip():
            raise ValueError("the metrics token is empty")
        if self.coordinator_interval_ms < 10:
            raise ValueError("the coordinator interval must be at least 10 ms")
        if self.retention_interval_ms is not None and self.retention_interval_ms < 100:
            raise ValueError("the retention interval must be at least 100 ms")


class Role(enum.Enum):
    VIEWER = "viewer"
    OPERATOR = "operator"
    BOOTSTRAP = "bootstrap"


class Access(enum.Enum):
    PUBLIC = "public"  # health, openapi
    READ = "read"  # viewer or operator
    WRITE = "write"  # operator
    REGISTER = "register"  # worker bootstrap
    WORKER = "worker"  # a worker session token (checked by the database)
    METRICS = "metrics"  # the metrics token when one is set


CONFIG = web.AppKey("config", GatewayConfig)
DB = web.AppKey("db", Database)
LISTENER = web.AppKey("listener", DispatchListener)
METRICS = web.AppKey("metrics", Metrics)
COORDINATOR = web.AppKey("coordinator", Coordinator)
OPENAPI = web.AppKey("openapi", bytes)


# -- JSON ----------------------------------------------------------------------------------------------


def _json_default(value: Any) -> Any:
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
    return json.dumps(value, default=_json_default, ensure_ascii=False, separators=(",", ":"))


def json_response(value: Any, status: int = 200) -> web.Response:
    return web.Response(text=dumps(value), status=status, content_type="application/json")


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise ValueError("duplicate keys in an object")
    return obj


def _has_nul(value: Any) -> bool:
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


def canonical_hash(value: Any) -> str:
    """SHA-256 of a canonical JSON encoding: the identity of a request for idempotency keys."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


# -- request parsing -----------------------------------------------------------------------------------


def bad_request(message: str) -> ApiError:
    return ApiError.of(400, message)


async def read_body(request: web.Request, limit: int) -> bytes:
    """The raw body, at most ``limit`` bytes (413 beyond)."""
    too_large = ApiError.of(413, f"the request body exceeds {limit} bytes")
    if request.content_length is not None and request.content_length > limit:
        raise too_large
    data = bytearray()
    while True:
        chunk = await request.content.read(65536)
        if not chunk:
            return bytes(data)
        data += chunk
        if len(data) > limit:
            raise too_large


async def json_body(request: web.Request, limit: int = BODY_LIMIT, allow_empty: bool = False) -> dict[str, Any]:
    """Exactly one JSON object (``{}`` for an empty body when ``allow_empty``)."""
    data = await read_body(request, limit)
    if not data.strip():
        if allow_empty:
            return {}
        raise bad_request("the request body must be a JSON object")
    try:
        value = json.loads(data, parse_constant=_no_constants, object_pairs_hook=_unique_keys)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise bad_request(f"the request body is not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise bad_request("the request body must be a JSON object")
    if _has_nul(value):
        raise bad_request("strings must not contain the NUL character (U+0000)")
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


def as_str(value: Any, name: str, max_len: int = 1024) -> str:
    if not isinstance(value, str) or not 1 <= len(value) <= max_len:
        raise bad_request(f"{name} must be a string of 1-{max_len} characters")
    return value


def path_param(request: web.Request, name: str) -> str:
    value = request.match_info[name]
    if "\x00" in value or len(value) > 1024:
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
    if "\x00" in value or len(value) > max_len:
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
    if not key or "\x00" in key or encode_cursor(key) != cursor:
        raise bad_request("invalid cursor")
    return key


def page(items: list[Any], next_cursor: str | None = None) -> dict[str, Any]:
    return {"items": items, "next_cursor": next_cursor}


# Paging of list routes: ``limit`` (1-100, default 50) and an opaque ``cursor``: base64url of the JSON list of
# the sort key of the last row of the previous page (a whole keyset key, so a page follows its cursor while
# rows are added, and even when the cursor's row was pruned meanwhile). A malformed cursor is 400.
PAGE_LIMIT_MAX = 100
PAGE_LIMIT_DEFAULT = 50
_LEGACY_RUN_CURSOR = re.compile(r"^run_[A-Za-z0-9]{1,64}$")


def page_limit(request: web.Request) -> int:
    return query_int(request, "limit", 1, PAGE_LIMIT_MAX, PAGE_LIMIT_DEFAULT)


def key_cursor(*values: Any) -> str:
    """The opaque cursor of a sort key."""
    return encode_cursor(dumps(list(values)))


def _key_value(value: Any, kind: str) -> Any:
    if kind == "int" and isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= INT32_MAX:
        return value
    if kind in ("str", "ts") and isinstance(value, str) and 1 <= len(value) <= 1024 and "\x00" not in value:
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
        values = json.loads(raw, parse_constant=_no_constants)
    except (ValueError, RecursionError):
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


def _iso(value: Any) -> Any:
    return _json_default(value) if isinstance(value, dt.datetime) else value


# -- authentication ------------------------------------------------------------------------------------


def bearer_token(request: web.Request) -> str | None:
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    return token


def _same(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())


def role_of(config: GatewayConfig, token: str) -> Role | None:
    """The role a token grants; every secret is compared (in constant time) whatever matches."""
    matches = [
        (Role.VIEWER, _same(token, config.viewer_token)),
        (Role.OPERATOR, _same(token, config.operator_token)),
        (Role.BOOTSTRAP, _same(token, config.bootstrap_token)),
    ]
    for role, matched in matches:
        if matched:
            return role
    return None


def authorize(request: web.Request, access: Access) -> None:
    config = request.app[CONFIG]
    if access is Access.PUBLIC:
        return
    token = bearer_token(request)
    if access is Access.METRICS:
        if config.metrics_token is not None and (token is None or not _same(token, config.metrics_token)):
            raise ApiError.of(401, "a valid metrics token is required")
        return
    if token is None:
        raise ApiError.of(401, "missing or malformed Authorization: Bearer header")
    if access is Access.WORKER:
        return  # the session token is checked by the database
    role = role_of(config, token)
    allowed = {
        Access.READ: {Role.VIEWER, Role.OPERATOR},
        Access.WRITE: {Role.OPERATOR},
        Access.REGISTER: {Role.BOOTSTRAP},
    }[access]
    if role in allowed:
        return
    if role is None or role is Role.BOOTSTRAP:  # the bootstrap token is just a wrong token elsewhere
        raise ApiError.of(401, "invalid token")
    raise ApiError.of(403, f"the {role.value} token may not {request.method} this route")


# -- routes --------------------------------------------------------------------------------------------

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
ROUTES: list[tuple[str, str, Access, Handler]] = []


def route(method: str, path: str, access: Access) -> Callable[[Handler], Handler]:
    def register(handler: Handler) -> Handler:
        async def guarded(request: web.Request) -> web.StreamResponse:
            authorize(request, access)
            return await handler(request)

        guarded.__name__ = handler.__name__
        ROUTES.append((method, path, access, guarded))
        return handler

    return register


# health, metrics, contract


@route("GET", "/health/live", Access.PUBLIC)
async def health_live(request: web.Request) -> web.Response:
    return json_response({"status": "live"})


@route("GET", "/health/ready", Access.PUBLIC)
async def health_ready(request: web.Request) -> web.Response:
    app = request.app
    coordinator = app.get(COORDINATOR)
    state: dict[str, Any] = {
        "database": "ok",
        "coordinator": "disabled" if coordinator is None else ("active" if coordinator.active else "standby"),
        "coordinator_active": bool(coordinator and coordinator.active),
        "dispatch_listener": "connected" if app[LISTENER].connected else "disconnected",
    }
    try:
        await app[DB].ping()
    except (psycopg.Error, psycopg_pool.PoolTimeout, OSError) as e:
        app[DB].connection_lost()
        message = f"the database is unreachable: {type(e).__name__}"
        state.update(
            status="not_ready",
            database="unreachable",
            error={"code": "unavailable", "message": message, "request_id": request["request_id"]},
        )
        return json_response(state, status=503)
    return json_response({"status": "ready", **state})


@route("GET", "/metrics", Access.METRICS)
async def metrics(request: web.Request) -> web.Response:
    metrics = request.app[METRICS]
    try:
        snapshot = await request.app[DB].metrics_snapshot()
    except (psycopg.Error, psycopg_pool.PoolTimeout, OSError):
        log.warning("metrics: the database is unreachable; database gauges not refreshed")
        snapshot = None
    metrics.set_snapshot(snapshot)
    coordinator = request.app.get(COORDINATOR)
    metrics.coordinator_active.set(1 if coordinator and coordinator.active else 0)
    response = web.Response(body=metrics.render())
    response.headers["Content-Type"] = CONTENT_TYPE
    return response


@route("GET", API + "/openapi.yaml", Access.PUBLIC)
async def openapi(request: web.Request) -> web.Response:
    return web.Response(body=request.app[OPENAPI], content_type="application/yaml")


# workflows


@route("POST", API + "/workflows", Access.WRITE)
async def apply_workflow(request: web.Request) -> web.Response:
    key = idempotency_key(request)
    definition = await json_body(request, limit=WORKFLOW_BODY_LIMIT)
    row = await request.app[DB].apply_workflow_idempotent(key, canonical_hash(definition), definition)
    body = {"workflow_id": row["workflow_id"], "version": row["version"]}
    return json_response(body, status=201 if row["created"] else 200)


@route("GET", API + "/workflows", Access.READ)
async def list_workflows(request: web.Request) -> web.Response:
    limit = page_limit(request)
    (after,) = cursor_key(request, "str")
    rows = await request.app[DB].list_workflows(after, limit + 1)
    return json_response(keyset_page(rows, limit, lambda r: [r["workflow_id"]]))


@route("GET", API + "/workflows/{workflow_id}", Access.READ)
async def get_workflow(request: web.Request) -> web.Response:
    return json_response(await request.app[DB].get_workflow(path_param(request, "workflow_id")))


@route("GET", API + "/workflows/{workflow_id}/versions", Access.READ)
async def workflow_versions(request: web.Request) -> web.Response:
    workflow_id, limit = path_param(request, "workflow_id"), page_limit(request)
    (after,) = cursor_key(request, "int")
    rows = await request.app[DB].workflow_versions(workflow_id, after, limit + 1)
    return json_response(keyset_page(rows, limit, lambda r: [r["version"]]))


@route("GET", API + "/workflows/{workflow_id}/versions/{version}", Access.READ)
async def get_workflow_version(request: web.Request) -> web.Response:
    workflow_id, version = path_param(request, "workflow_id"), path_int(request, "version")
    return json_response(await request.app[DB].get_workflow_version(workflow_id, version))


# runs


@route("POST", API + "/workflows/{workflow_id}/versions/{version}/runs", Access.WRITE)
async def start_run(request: web.Request) -> web.Response:
    key = idempotency_key(request)
    workflow_id, version = path_param(request, "workflow_id"), path_int(request, "version")
    body = await json_body(request, allow_empty=True)
    only_fields(body, optional=("input",))
    run_input = body.get("input")
    if run_input is None:
        run_input = {}
    if not isinstance(run_input, dict):
        raise bad_request("input must be a JSON object")
    # No input, null and {} are one request (hashed as the empty body was before runs took input).
    normal_body = {"input": run_input} if run_input else {}
    request_hash = canonical_hash({"workflow_id": workflow_id, "version": version, "body": normal_body})
    row = await request.app[DB].start_run_idempotent(key, request_hash, workflow_id, version, run_input)
    return json_response({"run_id": row["run_id"], "status": row["status"]}, status=202)


@route("GET", API + "/runs", Access.READ)
async def list_runs(request: web.Request) -> web.Response:
    limit = page_limit(request)
    cursor = query_str(request, "cursor")
    after = after_created_at = None
    if cursor is not None:
        raw = decode_cursor(cursor)
        if raw.startswith("["):
            after_created_at, after = parse_key(raw, ("ts", "str"))
        elif _LEGACY_RUN_CURSOR.match(raw):  # a cursor of an earlier release: the run id alone
            after = raw
        else:
            raise bad_request("invalid cursor")
    rows = await request.app[DB].list_runs(
        query_str(request, "workflow_id"), query_str(request, "status"), after, limit + 1, after_created_at
    )
    return json_response(keyset_page(rows, limit, lambda r: [_iso(r["created_at"]), r["run_id"]]))


@route("GET", API + "/runs/{run_id}", Access.READ)
async def get_run(request: web.Request) -> web.Response:
    return json_response(await request.app[DB].get_run(path_param(request, "run_id")))


@route("GET", API + "/runs/{run_id}/tasks", Access.READ)
async def run_tasks(request: web.Request) -> web.Response:
    run_id, limit = path_param(request, "run_id"), page_limit(request)
    (after,) = cursor_key(request, "str")
    rows = await request.app[DB].run_tasks(run_id, after, limit + 1)
    return json_response(keyset_page(rows, limit, lambda r: [r["task_key"]]))


@route("GET", API + "/runs/{run_id}/tasks/{task_key}", Access.READ)
async def get_task(request: web.Request) -> web.Response:
    run_id, task_key = path_param(request, "run_id"), path_param(request, "task_key")
    return json_response(await request.app[DB].get_task(run_id, task_key))


@route("GET", API + "/runs/{run_id}/events", Access.READ)
async def run_events(request: web.Request) -> web.Response:
    run_id = path_param(request, "run_id")
    cursor = query_str(request, "cursor")
    if cursor is not None:
        if not cursor.isascii() or not cursor.isdigit() or len(cursor) > 18:
            raise bad_request("invalid cursor")
        after = int(cursor)
    else:
        after = query_int(request, "after", 0, 2**62, 0)
    limit = page_limit(request)
    rows = await request.app[DB].run_events(run_id, after, limit + 1)
    next_cursor = str(rows[limit - 1]["sequence"]) if len(rows) > limit else None
    return json_response(page(rows[:limit], next_cursor))


@route("POST", API + "/runs/{run_id}/cancel", Access.WRITE)
async def cancel_run(request: web.Request) -> web.Response:
    run_id = path_param(request, "run_id")
    only_fields(await json_body(request, allow_empty=True))
    return json_response(await request.app[DB].request_cancel(run_id))


def idempotency_key(request: web.Request) -> str:
    key = request.headers.get("Idempotency-Key")
    if key is None or not key.strip():
        raise bad_request("the Idempotency-Key header is required")
    if len(key) > 255:
        raise bad_request("the Idempotency-Key header must have 1-255 characters")
    return key


# schedules (docs/schedules.md): creating is idempotent by itself (the same definition returns the same
# schedule), so no Idempotency-Key header is needed.


def _parse_schedule(body: dict[str, Any]) -> tuple[str, str, str | None, int | None, dict[str, Any] | None, str]:
    only_fields(body, required=("schedule_id", "workflow_id"), optional=("cron", "interval_ms", "input", "timezone"))
    schedule_id = as_str(body["schedule_id"], "schedule_id", 128)
    workflow_id = as_str(body["workflow_id"], "workflow_id", 128)
    cron = None if body.get("cron") is None else as_str(body["cron"], "cron", 256)
    interval_ms = body.get("interval_ms")
    if interval_ms is not None:
        interval_ms = as_int(interval_ms, "interval_ms", 1000, INT32_MAX)
    if (cron is None) == (interval_ms is None):
        raise bad_request("give exactly one of cron and interval_ms")
    schedule_input = body.get("input")
    if schedule_input is not None and not isinstance(schedule_input, dict):
        raise bad_request("input must be a JSON object")
    timezone = "UTC" if body.get("timezone") is None else as_str(body["timezone"], "timezone", 128)
    return schedule_id, workflow_id, cron, interval_ms, schedule_input, timezone


@route("POST", API + "/schedules", Access.WRITE)
async def create_schedule(request: web.Request) -> web.Response:
    parsed = _parse_schedule(await json_body(request))
    return json_response(await request.app[DB].create_schedule(*parsed), status=201)


@route("GET", API + "/schedules", Access.READ)
async def list_schedules(request: web.Request) -> web.Response:
    limit = page_limit(request)
    (after,) = cursor_key(request, "str")
    rows = await request.app[DB].list_schedules(after, limit + 1)
    return json_response(keyset_page(rows, limit, lambda r: [r["schedule_id"]]))


@route("DELETE", API + "/schedules/{schedule_id}", Access.WRITE)
async def delete_schedule(request: web.Request) -> web.Response:
    return json_response(await request.app[DB].delete_schedule(path_param(request, "schedule_id")))


# workers


@route("POST", API + "/workers/register", Access.REGISTER)
async def register_worker(request: web.Request) -> web.Response:
    header = request.headers.get(PROTOCOL_HEADER)
    if header is not None and header.strip() != PROTOCOL_VERSION:
        raise ApiError(400, "worker_protocol_unsupported", f"{PROTOCOL_HEADER} {header!r} is not supported (1)")
    body = await json_body(request)
    only_fields(body, required=("executor_kinds",), optional=("display_name", "max_concurrency", "protocol_version"))
    kinds = body["executor_kinds"]
    if not isinstance(kinds, list) or not 1 <= len(kinds) <= 16 or not all(isinstance(k, str) for k in kinds):
        raise bad_request("executor_kinds must be a list of 1-16 executor kind names")
    display_name = as_str(body.get("display_name", "worker"), "display_name", 128)
    max_concurrency = as_int(body.get("max_concurrency", 1), "max_concurrency", 1, INT32_MAX)
    protocol_version = as_int(body.get("protocol_version", 1), "protocol_version", 0, INT32_MAX)
    row = await request.app[DB].register_worker(display_name, kinds, max_concurrency, protocol_version)
    request["echo_protocol"] = True
    return json_response(row, status=201)


async def worker_request(
    request: web.Request, parse: Callable[[dict[str, Any]], Any], allow_empty: bool = False
) -> tuple[str, str, Any]:
    """(worker_id, session token, parsed body) of a worker call.

    The session is checked first (python/awp/openapi.yaml): when anything else is wrong (protocol header, body),
    the database checks the session before the gateway answers, so an invalid session always wins.
    """
    request["echo_protocol"] = True
    worker_id = path_param(request, "worker_id")
    token = bearer_token(request) or ""
    try:
        header = request.headers.get(PROTOCOL_HEADER)
        if header is None or header.strip() != PROTOCOL_VERSION:
            raise ApiError(
                400,
                "worker_protocol_unsupported",
                f"header {PROTOCOL_HEADER}: {PROTOCOL_VERSION} is required (got {header!r})",
            )
        parsed = parse(await json_body(request, allow_empty=allow_empty))
    except ApiError:
        await request.app[DB].check_worker_session(worker_id, token)
        raise
    return worker_id, token, parsed


def _parse_claim(body: dict[str, Any]) -> tuple[int, int]:
    only_fields(body, required=("slots",), optional=("wait_ms",))
    slots = as_int(body["slots"], "slots", 1, INT32_MAX)
    wait_ms = as_int(body.get("wait_ms", 0), "wait_ms", 0, MAX_WAIT_MS)
    return slots, wait_ms


@route("POST", API + "/workers/{worker_id}/claims", Access.WORKER)
async def claim(request: web.Request) -> web.Response:
    worker_id, token, (slots, wait_ms) = await worker_request(request, _parse_claim)
    db, listener, config = request.app[DB], request.app[LISTENER], request.app[CONFIG]
    leases = await db.claim_tasks(worker_id, token, slots)
    if not leases and wait_ms > 0:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_ms / 1000
        recheck = config.claim_recheck_ms / 1000
        while not leases:
            remaining = deadline - loop.time()
            if remaining <= 0 or listener.closed:
                break
            # A wake-up (NOTIFY awp_dispatch) re-checks at once; otherwise every ~recheck seconds, jittered
            # so many idle workers do not query in step.
            await listener.wait(min(remaining, recheck * random.uniform(0.8, 1.2)))
            transport = request.transport
            if listener.closed or transport is None or transport.is_closing():
                break  # shutting down, or the worker hung up: leasing now would strand the lease
            leases = await db.claim_tasks(worker_id, token, slots)
    metrics = request.app[METRICS]
    metrics.claims.labels("leased" if leases else "empty").inc()
    if leases:
        metrics.leases_issued.inc(len(leases))
    return json_response({"leases": leases})


def _parse_heartbeat(body: dict[str, Any]) -> list[dict[str, str]]:
    only_fields(body, optional=("leases",))
    leases = body.get("leases", [])
    if not isinstance(leases, list) or len(leases) > 1024:
        raise bad_request("leases must be a list of at most 1024 {dispatch_id, lease_token} objects")
    for lease in leases:
        if not isinstance(lease, dict) or set(lease) != {"dispatch_id", "lease_token"}:
            raise bad_request("each lease must be exactly {dispatch_id, lease_token}")
        as_str(lease["dispatch_id"], "dispatch_id")
        as_str(lease["lease_token"], "lease_token")
    return leases


@route("POST", API + "/workers/{worker_id}/heartbeat", Access.WORKER)
async def heartbeat(request: web.Request) -> web.Response:
    worker_id, token, leases = await worker_request(request, _parse_heartbeat)
    rows = await request.app[DB].heartbeat(worker_id, token, leases)
    return json_response({"leases": rows})


def _parse_complete(body: dict[str, Any]) -> tuple[str, dict[str, Any], int | None]:
    only_fields(body, required=("lease_token", "result"), optional=("claim_slots",))
    lease_token = as_str(body["lease_token"], "lease_token")
    claim_slots = as_int(body["claim_slots"], "claim_slots", 0, 1000) if "claim_slots" in body else None
    result = body["result"]
    _check_result_shape(result)
    return lease_token, result, claim_slots


def _check_result_shape(result: Any) -> None:
    """The result object's shape (its sizes are checked by the database)."""
    if not isinstance(result, dict):
        raise bad_request("result must be an object")
    only_fields(result, required=("kind",), optional=("output", "error_code", "error_message"))
    if result["kind"] not in RESULT_KINDS:
        raise bad_request(f"result.kind must be one of {', '.join(RESULT_KINDS)}")
    for name in ("error_code", "error_message"):
        if result.get(name) is not None and not isinstance(result[name], str):
            raise bad_request(f"result.{name} must be a string")


@route("POST", API + "/workers/{worker_id}/leases/{dispatch_id}/complete", Access.WORKER)
async def complete(request: web.Request) -> web.Response:
    worker_id, token, (lease_token, result, claim_slots) = await worker_request(request, _parse_complete)
    dispatch_id = path_param(request, "dispatch_id")
    db, metrics = request.app[DB], request.app[METRICS]
    if claim_slots is None:
        applied = await db.complete_task(worker_id, token, dispatch_id, lease_token, result)
        metrics.completions.labels(str(bool(applied)).lower()).inc()
        return json_response({"applied": applied})
    # docs/protocol.md, The fast path: a busy worker's next leases ride on its completion (one round trip per task).
    leases = await db.complete_and_claim(worker_id, token, dispatch_id, lease_token, result, claim_slots)
    metrics.completions.labels("true").inc()
    if claim_slots:
        metrics.claims.labels("leased" if leases else "empty").inc()
        metrics.leases_issued.inc(len(leases))
    return json_response({"applied": True, "leases": leases})


MAX_BATCH = 256


def _parse_completions(body: dict[str, Any]) -> tuple[list[dict[str, Any]], int]:
    only_fields(body, required=("results",), optional=("claim_slots",))
    items = body["results"]
    if not isinstance(items, list) or not 1 <= len(items) <= MAX_BATCH:
        raise bad_request(f"results must be a list of 1-{MAX_BATCH} {{dispatch_id, lease_token, result}} objects")
    seen: set[str] = set()
    for item in items:
        if not isinstance(item, dict):
            raise bad_request("each result must be an object {dispatch_id, lease_token, result}")
        only_fields(item, required=("dispatch_id", "lease_token", "result"))
        dispatch_id = as_str(item["dispatch_id"], "dispatch_id")
        if dispatch_id in seen:
            raise bad_request(f"dispatch {dispatch_id} appears twice")
        seen.add(dispatch_id)
        as_str(item["lease_token"], "lease_token")
        _check_result_shape(item["result"])
    claim_slots = as_int(body["claim_slots"], "claim_slots", 0, 1000) if "claim_slots" in body else 0
    return items, claim_slots


@route("POST", API + "/workers/{worker_id}/completions", Access.WORKER)
async def complete_many(request: web.Request) -> web.Response:
    """Several results (and the next leases) in one request and one transaction: each result is answered on
    its own (``applied`` or the error complete would give), a bad one does not spoil the others."""
    worker_id, token, (items, claim_slots) = await worker_request(request, _parse_completions)
    db, metrics = request.app[DB], request.app[METRICS]
    answer = await db.complete_tasks(worker_id, token, items, claim_slots)
    results = []
    for item in answer["results"]:
        error = item.get("error")
        if error is None:
            results.append({"dispatch_id": item["dispatch_id"], "applied": True})
            metrics.completions.labels("true").inc()
            continue
        _, code = SQLSTATE_ERRORS[error["sqlstate"]]  # only AWLST, AWCNF and AWREQ are answered per item
        message = join_message(error["message"], error.get("detail"))
        results.append({"dispatch_id": item["dispatch_id"], "error": {"code": code, "message": message}})
    leases = answer["leases"]
    if claim_slots:
        metrics.claims.labels("leased" if leases else "empty").inc()
        metrics.leases_issued.inc(len(leases))
    return json_response({"results": results, "leases": leases})


@route("POST", API + "/workers/{worker_id}/drain", Access.WORKER)
async def drain(request: web.Request) -> web.Response:
    worker_id, token, _ = await worker_request(request, lambda body: only_fields(body), allow_empty=True)
    return json_response(await request.app[DB].drain_worker(worker_id, token))


@route("GET", API + "/workers", Access.READ)
async def list_workers(request: web.Request) -> web.Response:
    limit = page_limit(request)
    after_registered_at, after_worker_id = cursor_key(request, "ts", "str")
    rows = await request.app[DB].list_workers(after_registered_at, after_worker_id, limit + 1)
    return json_response(keyset_page(rows, limit, lambda r: [_iso(r["registered_at"]), r["worker_id"]]))


@route("GET", API + "/workers/{worker_id}", Access.READ)
async def get_worker(request: web.Request) -> web.Response:
    return json_response(await request.app[DB].get_worker(path_param(request, "worker_id")))


# cluster status (`awp status`; docs/limits.md)


@route("GET", API + "/status", Access.READ)
async def cluster_status(request: web.Request) -> web.Response:
    """One screen of the cluster: workers and slots by executor kind, live dispatches against dispatch_limit,
    the oldest waiting task and why, and the time of the latest coordinator pass (awp.cluster_status)."""
    return json_response(await request.app[DB].cluster_status())


# -- middleware ----------------------------------------------------------------------------------------


def error_response(error: ApiError, request_id: str, headers: dict[str, str] | None = None) -> web.Response:
    body = {"error": {"code": error.code, "message": error.message, "request_id": request_id}}
    response = json_response(body, status=error.status)
    if headers:
        response.headers.update(headers)
    return response


def _route_label(request: web.Request) -> str:
    info = request.match_info
    resource = info.route.resource if info is not None and info.http_exception is None else None
    return resource.canonical if resource is not None else "unmatched"


@web.middleware
async def api_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    incoming = request.headers.get("X-Request-Id", "")
    request_id = incoming if _REQUEST_ID.match(incoming) else uuid.uuid4().hex
    request["request_id"] = request_id
    started = time.perf_counter()
    try:
        response = await handler(request)
    except ApiError as e:
        response = error_response(e, request_id)
    except web.HTTPException as e:
        status = e.status if e.status in (404, 405, 413) else 400
        extra = {"Allow": e.headers["Allow"]} if "Allow" in e.headers else None
        response = error_response(ApiError.of(status, e.reason), request_id, extra)
    except (psycopg.Error, psycopg_pool.PoolTimeout) as e:
        error = from_database_error(e)
        if error is None:
            log.error("request %s %s failed: %s", request_id, request.path, e, exc_info=e)
            error = ApiError.of(500, "internal error; see the gateway log for request id " + request_id)
        elif error.status == 503:
            log.warning("request %s: database unavailable: %s", request_id, e)
            request.app[DB].connection_lost()
        response = error_response(error, request_id)
    except (asyncio.CancelledError, KeyboardInterrupt):
        raise
    except Exception as e:
        log.error("request %s %s failed", request_id, request.path, exc_info=e)
        response = error_response(ApiError.of(500, "internal error; request id " + request_id), request_id)
    response.headers["X-Request-Id"] = request_id
    if request.get("echo_protocol"):
        response.headers[PROTOCOL_HEADER] = PROTOCOL_VERSION
    elapsed = time.perf_counter() - started
    label = _route_label(request)
    request.app[METRICS].observe_request(request.method, label, response.status, elapsed)
    access_log.info(
        "request_id=%s method=%s route=%s status=%d duration_ms=%.1f",
        request_id,
        request.method,
        label,
        response.status,
        elapsed * 1000,
    )
    return response


# -- the application -----------------------------------------------------------------------------------


def load_openapi() -> bytes:
    return resources.files("awp").joinpath("openapi.yaml").read_bytes()


def create_app(config: GatewayConfig) -> web.Application:
    """The aiohttp application; the database, listener and coordinator start with it (cleanup_ctx)."""
    config.check()
    app = web.Application(middlewares=[api_middleware], client_max_size=WORKFLOW_BODY_LIMIT + 1)
    app[CONFIG] = config
    app[METRICS] = Metrics()
    app[DB] = Database(config.database_url, pool_size=config.pool_size)
    app[LISTENER] = DispatchListener(config.database_url)
    app[OPENAPI] = load_openapi()
    if config.coordinator:
        metrics = app[METRICS]
        app[COORDINATOR] = Coordinator(
            config.database_url,
            interval_s=config.coordinator_interval_ms / 1000,
            on_pass=metrics.observe_pass,
            on_active=lambda active: metrics.coordinator_active.set(1 if active else 0),
            serving=lambda: not app[DB].failed_within(1.0),
            retention_interval_s=None if config.retention_interval_ms is None else config.retention_interval_ms / 1000,
            on_retention=metrics.observe_retention,
        )
    for method, path, _access, handler in ROUTES:
        app.router.add_route(method, path, handler, name=handler.__name__)
    from awp.ui import setup_ui  # the dashboard (/ui/); imported here since it imports this module

    setup_ui(app)
    app.cleanup_ctx.append(_lifecycle)
    app.on_shutdown.append(_on_shutdown)
    return app


async def _lifecycle(app: web.Application) -> Any:
    await app[DB].open()
    app[LISTENER].start()
    coordinator = app.get(COORDINATOR)
    if coordinator is not None:
        coordinator.start()
    yield
    if coordinator is not None:
        await coordinator.stop()
    await app[LISTENER].close()
    await app[DB].close()


async def _on_shutdown(app: web.Application) -> None:
    """Stop accepting work: end long-polls at once (they answer an empty lease list)."""
    await app[LISTENER].close()
