"""The HTTP gateway's routes (python/awp/openapi.yaml), and nothing else.

A handler authenticates (:mod:`awp.server.auth`), parses and validates (:mod:`awp.server.parsing`), calls one SQL
function (:class:`awp.server.db.Database`), and shapes the answer (:mod:`awp.protocol.jsonio`). Errors are
:class:`awp.server.errors.ApiError`;
:mod:`awp.server.middleware` turns them into the error envelope. The application is built in :mod:`awp.server.app`.

Routes under ``/api/v1``; ``/health/live``, ``/health/ready`` and ``/metrics`` at the root.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
import psycopg_pool
from aiohttp import web

from awp.protocol.jsonio import bad_text, canonical_hash
from awp.protocol.limits import (
    MAX_BATCH_RESULTS,
    MAX_BATCH_RUNS,
    MAX_HEARTBEAT_LIST,
    MAX_PENDING_CLAIMS,
    PROTOCOL_HEADER,
    PROTOCOL_VERSION,
    WORKFLOW_BODY_LIMIT,
)
from awp.protocol.results import RESULT_KINDS
from awp.server.answers import json_response
from awp.server.appstate import (
    API,
    CONFIG,
    COORDINATOR,
    DB,
    LISTENER,
    METRICS,
    OPENAPI,
    STREAMS,
)
from awp.server.auth import Access, Role, authorize, bearer_token, role_of
from awp.server.db import PoolSaturated
from awp.server.errors import SQLSTATE_ERRORS, ApiError, from_sqlstate, join_message
from awp.server.grouping import ItemError
from awp.server.metrics import CONTENT_TYPE
from awp.server.middleware import Handler
from awp.server.parsing import (
    INT32_MAX,
    LEGACY_RUN_CURSOR,
    as_int,
    as_str,
    bad_request,
    cursor_key,
    decode_cursor,
    iso,
    json_body,
    keyset_page,
    only_fields,
    page,
    page_limit,
    parse_key,
    path_int,
    path_param,
    progress_write,
    query_int,
    query_str,
)

log = logging.getLogger(__name__)

MAX_WAIT_MS = 30_000

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
    """``ready`` (200), ``saturated`` (200: the database answers but every request connection is busy and
    requests queue; heartbeats are still served by their own pool), ``not_ready`` (503: no database)."""
    app = request.app
    db = app[DB]
    coordinator = app.get(COORDINATOR)
    state: dict[str, Any] = {
        "database": "ok",
        "coordinator": "disabled" if coordinator is None else ("active" if coordinator.active else "standby"),
        "coordinator_active": bool(coordinator and coordinator.active),
        "dispatch_listener": "connected" if app[LISTENER].connected else "disconnected",
    }
    try:
        await db.ping()
    except PoolSaturated:  # even the heartbeat pool is busy: the database may be fine
        return json_response({"status": "saturated", **state, "database": "busy", "pools": db.pool_state()})
    except (psycopg.Error, psycopg_pool.PoolTimeout, OSError) as e:
        db.connection_lost()
        message = f"the database is unreachable: {type(e).__name__}"
        state.update(
            status="not_ready",
            database="unreachable",
            error={"code": "unavailable", "message": message, "request_id": request["request_id"]},
        )
        return json_response({**state, "pools": db.pool_state()}, status=503)
    status = "saturated" if db.saturated() else "ready"
    return json_response({"status": status, **state, "pools": db.pool_state()})


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
    only_fields(body, optional=("input", "priority"))
    run_input, priority, request_hash = _run_request(workflow_id, version, body, "")
    row = await request.app[DB].start_run_idempotent(key, request_hash, workflow_id, version, run_input, priority)
    return json_response({"run_id": row["run_id"], "status": row["status"]}, status=202)


def _run_request(
    workflow_id: str, version: int, body: dict[str, Any], where: str
) -> tuple[dict[str, Any], int | None, str]:
    """A run start's input, priority (docs/limits.md, Priority) and request hash, for the single and the batch route.
    No input, null and {} are one request (hashed as the empty body was before runs took input); so are no priority
    and null."""
    run_input = body.get("input")
    if run_input is None:
        run_input = {}
    if not isinstance(run_input, dict):
        raise bad_request(f"{where}input must be a JSON object")
    priority = body.get("priority")
    if priority is not None:
        priority = as_int(priority, f"{where}priority", 0, 9)
    normal_body: dict[str, Any] = {"input": run_input} if run_input else {}
    if priority is not None:
        normal_body["priority"] = priority
    request_hash = canonical_hash({"workflow_id": workflow_id, "version": version, "body": normal_body})
    return run_input, priority, request_hash


def _start_item(workflow_id: str, version: int, item: Any, where: str) -> dict[str, Any]:
    """One item of a batch start as awp.start_runs_idempotent takes it: its key, its input, and the hash the
    single start route gives the same request (so a batch item and a single start with one key are one request)."""
    if not isinstance(item, dict):
        raise bad_request(f"{where} must be an object")
    unknown = sorted(set(item) - {"input", "idempotency_key", "priority"})
    if unknown:
        raise bad_request(f"{where}: unknown fields: {', '.join(unknown)}")
    key = item.get("idempotency_key")
    if not isinstance(key, str) or not 1 <= len(key) <= 255:
        raise bad_request(f"{where}: idempotency_key must be a string of 1-255 characters")
    run_input, priority, request_hash = _run_request(workflow_id, version, item, f"{where}: ")
    start: dict[str, Any] = {"idempotency_key": key, "request_hash": request_hash, "input": run_input}
    if priority is not None:
        start["priority"] = priority
    return start


@route("POST", API + "/workflows/{workflow_id}/versions/{version}/runs/batch", Access.WRITE)
async def start_runs(request: web.Request) -> web.Response:
    """Many runs in one call, all or nothing: {"runs": [{"idempotency_key", "input"?, "priority"?}, ...]} (1-1,000)."""
    workflow_id, version = path_param(request, "workflow_id"), path_int(request, "version")
    body = await json_body(request, limit=WORKFLOW_BODY_LIMIT)
    only_fields(body, required=("runs",))
    runs = body["runs"]
    if not isinstance(runs, list) or not 1 <= len(runs) <= MAX_BATCH_RUNS:
        raise bad_request(f"runs must be an array of 1-{MAX_BATCH_RUNS} objects")
    items = [_start_item(workflow_id, version, item, f"runs[{i}]") for i, item in enumerate(runs)]
    rows = await request.app[DB].start_runs_idempotent(workflow_id, version, items)
    answer = [{"run_id": r["run_id"], "status": r["status"], "replayed": r["replayed"]} for r in rows]
    return json_response({"runs": answer}, status=202)


@route("GET", API + "/runs", Access.READ)
async def list_runs(request: web.Request) -> web.Response:
    limit = page_limit(request)
    cursor = query_str(request, "cursor")
    after = after_created_at = None
    if cursor is not None:
        raw = decode_cursor(cursor)
        if raw.startswith("["):
            after_created_at, after = parse_key(raw, ("ts", "str"))
        elif LEGACY_RUN_CURSOR.match(raw):  # a cursor of an earlier release: the run id alone
            after = raw
        else:
            raise bad_request("invalid cursor")
    rows = await request.app[DB].list_runs(
        query_str(request, "workflow_id"), query_str(request, "status"), after, limit + 1, after_created_at
    )
    return json_response(keyset_page(rows, limit, lambda r: [iso(r["created_at"]), r["run_id"]]))


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


@route("POST", API + "/runs/{run_id}/tasks/{task_key}/signal", Access.WRITE)
async def send_signal(request: web.Request) -> web.Response:
    """The signal a task of executor signal waits for (docs/waits.md): ``{"payload": {...}}``; the Idempotency-Key
    header (optional) makes a repeat with the same payload answer as the first time."""
    run_id, task_key = path_param(request, "run_id"), path_param(request, "task_key")
    key = idempotency_key(request) if "Idempotency-Key" in request.headers else None
    body = await json_body(request)
    only_fields(body, required=("payload",))
    if not isinstance(body["payload"], dict):
        raise bad_request("payload must be a JSON object")
    return json_response(await request.app[DB].send_signal(run_id, task_key, body["payload"], key))


@route("POST", API + "/runs/{run_id}/retry", Access.WRITE)
async def retry_run(request: web.Request) -> web.Response:
    """Re-run a failed or canceled run (awp.retry_run; docs/protocol.md, Re-run): ``{"task_keys"?: [...]}``; with
    an Idempotency-Key header a repeat answers as the first time."""
    run_id = path_param(request, "run_id")
    body = await json_body(request, allow_empty=True)
    only_fields(body, optional=("task_keys",))
    keys = body.get("task_keys")
    if keys is not None and (not isinstance(keys, list) or not all(isinstance(k, str) for k in keys)):
        raise bad_request("task_keys must be an array of task keys")
    db = request.app[DB]
    if "Idempotency-Key" in request.headers:
        key = idempotency_key(request)
        row = await db.retry_run_idempotent(key, canonical_hash({"run_id": run_id, "body": body}), run_id, keys)
    else:
        row = await db.retry_run(run_id, keys)
    return json_response({"run_id": row["run_id"], "status": row["status"], "task_keys": row["task_keys"]})


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
    if bad_text(key):
        raise bad_request("the Idempotency-Key header must be UTF-8 text")
    return key


# rate limits (docs/limits.md, Rate limits and concurrency keys): PUT replaces, so no Idempotency-Key is needed.


@route("GET", API + "/limits", Access.READ)
async def list_limits(request: web.Request) -> web.Response:
    return json_response({"items": await request.app[DB].list_limits()})


@route("GET", API + "/limits/{name}", Access.READ)
async def get_limit(request: web.Request) -> web.Response:
    return json_response(await request.app[DB].get_limit(path_param(request, "name")))


@route("PUT", API + "/limits/{name}", Access.WRITE)
async def set_limit(request: web.Request) -> web.Response:
    """``{"max_in_flight"?, "per_window"?, "window_ms"?}`` (awp.set_limit checks the combination)."""
    name = path_param(request, "name")
    body = await json_body(request)
    only_fields(body, optional=("max_in_flight", "per_window", "window_ms"))
    numbers = [
        None if body.get(field) is None else as_int(body[field], field, 1, INT32_MAX)
        for field in ("max_in_flight", "per_window", "window_ms")
    ]
    return json_response(await request.app[DB].set_limit(name, *numbers))


@route("DELETE", API + "/limits/{name}", Access.WRITE)
async def delete_limit(request: web.Request) -> web.Response:
    name = path_param(request, "name")
    if not await request.app[DB].delete_limit(name):
        raise ApiError(404, "not_found", f"limit not found: no limit {name}")
    return json_response({"name": name, "deleted": True})


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
    if header is not None and header.strip() != str(PROTOCOL_VERSION):
        raise ApiError(400, "worker_protocol_unsupported", f"{PROTOCOL_HEADER} {header!r} is not supported (1)")
    body = await json_body(request)
    only_fields(
        body, required=("executor_kinds",), optional=("display_name", "max_concurrency", "protocol_version", "actions")
    )
    kinds = body["executor_kinds"]
    if not isinstance(kinds, list) or not 1 <= len(kinds) <= 16 or not all(isinstance(k, str) for k in kinds):
        raise bad_request("executor_kinds must be a list of 1-16 executor kind names")
    actions = body.get("actions")  # routing by action: checked by the database (awp._check_actions)
    if actions is not None and not isinstance(actions, dict):
        raise bad_request("actions must be an object {executor kind: [action, ...]}")
    display_name = as_str(body.get("display_name", "worker"), "display_name", 128)
    max_concurrency = as_int(body.get("max_concurrency", 1), "max_concurrency", 1, INT32_MAX)
    protocol_version = as_int(body.get("protocol_version", 1), "protocol_version", 0, INT32_MAX)
    row = await request.app[DB].register_worker(display_name, kinds, max_concurrency, protocol_version, actions)
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
        if header is None or header.strip() != str(PROTOCOL_VERSION):
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


# Lease recovery (docs/protocol.md): a worker numbers its claim requests (claim_seq, 1, 2, ...) and tells each
# heartbeat which of them have ended (claimed_through, claims_pending), so that a lease whose answer was lost
# goes back to the queue at once, without counting against max_attempts.
CLAIM_SEQ_MAX = 2**63 - 1


def _claim_seq(body: dict[str, Any]) -> int | None:
    return as_int(body["claim_seq"], "claim_seq", 1, CLAIM_SEQ_MAX) if "claim_seq" in body else None


def _parse_claim(body: dict[str, Any]) -> tuple[int, int, int | None]:
    only_fields(body, required=("slots",), optional=("wait_ms", "claim_seq"))
    slots = as_int(body["slots"], "slots", 1, INT32_MAX)
    wait_ms = as_int(body.get("wait_ms", 0), "wait_ms", 0, MAX_WAIT_MS)
    return slots, wait_ms, _claim_seq(body)


@route("POST", API + "/workers/{worker_id}/claims", Access.WORKER)
async def claim(request: web.Request) -> web.Response:
    worker_id, token, (slots, wait_ms, claim_seq) = await worker_request(request, _parse_claim)
    db, listener, config = request.app[DB], request.app[LISTENER], request.app[CONFIG]
    leases = await db.claim_tasks(worker_id, token, slots, claim_seq)
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
            leases = await db.claim_tasks(worker_id, token, slots, claim_seq)
    metrics = request.app[METRICS]
    metrics.claims.labels("leased" if leases else "empty").inc()
    if leases:
        metrics.leases_issued.inc(len(leases))
    return json_response({"leases": leases})


def _lease_refs(body: dict[str, Any], name: str) -> list[dict[str, str]]:
    refs = body.get(name, [])
    if not isinstance(refs, list) or len(refs) > MAX_HEARTBEAT_LIST:
        raise bad_request(f"{name} must be a list of at most {MAX_HEARTBEAT_LIST} {{dispatch_id, lease_token}} objects")
    for ref in refs:
        if not isinstance(ref, dict) or set(ref) != {"dispatch_id", "lease_token"}:
            raise bad_request(f"each entry of {name} must be exactly {{dispatch_id, lease_token}}")
        as_str(ref["dispatch_id"], "dispatch_id")
        as_str(ref["lease_token"], "lease_token")
    return refs


@dataclass(frozen=True)
class HeartbeatBody:
    leases: list[dict[str, str]]
    claimed_through: int | None
    claims_pending: list[int] | None
    dropped: list[dict[str, str]] | None


def _parse_heartbeat(body: dict[str, Any]) -> HeartbeatBody:
    only_fields(body, optional=("leases", "claimed_through", "claims_pending", "dropped"))
    leases = _lease_refs(body, "leases")
    dropped = _lease_refs(body, "dropped") if "dropped" in body else None
    claimed_through = (
        as_int(body["claimed_through"], "claimed_through", 0, CLAIM_SEQ_MAX) if "claimed_through" in body else None
    )
    pending = body.get("claims_pending")
    if pending is not None:
        if not isinstance(pending, list) or len(pending) > MAX_PENDING_CLAIMS:
            raise bad_request(f"claims_pending must be a list of at most {MAX_PENDING_CLAIMS} claim numbers")
        pending = [as_int(n, "each of claims_pending", 1, CLAIM_SEQ_MAX) for n in pending]
    if pending is not None and claimed_through is None:
        raise bad_request("claims_pending needs claimed_through")
    return HeartbeatBody(leases, claimed_through, pending, dropped)


@route("POST", API + "/workers/{worker_id}/heartbeat", Access.WORKER)
async def heartbeat(request: web.Request) -> web.Response:
    worker_id, token, hb = await worker_request(request, _parse_heartbeat)
    rows, worker_status = await request.app[DB].heartbeat(
        worker_id, token, hb.leases, hb.claimed_through, hb.claims_pending, hb.dropped
    )
    # worker_status: draining when an operator drained this worker (POST /workers/{id}/drain): it drains then.
    return json_response({"leases": rows, "worker_status": worker_status})


def _live_output(body: dict[str, Any], where: str) -> list[dict[str, Any]]:
    """A result's ``live_output``: the lease's last progress writes, sent with its result (docs/progress.md)."""
    writes = body.get("live_output", [])
    if not isinstance(writes, list) or len(writes) > MAX_BATCH_RESULTS:
        raise bad_request(f"{where}live_output must be an array of at most {MAX_BATCH_RESULTS} progress writes")
    for i, write in enumerate(writes):
        if not isinstance(write, dict):
            raise bad_request(f"{where}live_output[{i}] must be an object {{progress?, logs?, chunks?, offset?}}")
        only_fields(write, optional=("progress", "logs", "chunks", "offset"))
        progress_write(write, f"{where}live_output[{i}].")
    return writes


async def write_progress(
    request: web.Request, worker_id: str, token: str, items: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Progress writes of several leases (awp.report_progress_many; each answered on its own), and a wake-up of this
    gateway's event streams of their runs."""
    rows = await request.app[DB].report_progress_many(worker_id, token, items)
    hub = request.app[STREAMS]
    for run_id in {row["run_id"] for row in rows if row.get("run_id")}:
        hub.wake(run_id)
    return rows


def _parse_complete(body: dict[str, Any]) -> tuple[str, dict[str, Any], int | None, int | None, list[dict[str, Any]]]:
    only_fields(body, required=("lease_token", "result"), optional=("claim_slots", "claim_seq", "live_output"))
    lease_token = as_str(body["lease_token"], "lease_token")
    claim_slots = as_int(body["claim_slots"], "claim_slots", 0, 1000) if "claim_slots" in body else None
    result = body["result"]
    _check_result_shape(result)
    return lease_token, result, claim_slots, _claim_seq(body), _live_output(body, "")


def _check_result_shape(result: Any) -> None:
    """The result object's shape (its sizes are checked by the database: awp.protocol.results has the limits)."""
    if not isinstance(result, dict):
        raise bad_request("result must be an object")
    only_fields(result, required=("kind",), optional=("output", "error_code", "error_message", "error_detail"))
    if result["kind"] not in RESULT_KINDS:
        raise bad_request(f"result.kind must be one of {', '.join(RESULT_KINDS)}")
    for name in ("error_code", "error_message", "error_detail"):
        if result.get(name) is not None and not isinstance(result[name], str):
            raise bad_request(f"result.{name} must be a string")


@route("POST", API + "/workers/{worker_id}/leases/{dispatch_id}/complete", Access.WORKER)
async def complete(request: web.Request) -> web.Response:
    worker_id, token, (lease_token, result, claim_slots, claim_seq, live) = await worker_request(
        request, _parse_complete
    )
    dispatch_id = path_param(request, "dispatch_id")
    db, metrics = request.app[DB], request.app[METRICS]
    # The lease's last output (live_output) is written in the completion's own transaction, before its result
    # (docs/progress.md); a write the lease may no longer make is dropped.
    run_id = db.groups.run_of(dispatch_id) if live else None
    if claim_slots is None:
        applied = await db.complete_task(worker_id, token, dispatch_id, lease_token, result, live)
        if run_id is not None:
            request.app[STREAMS].wake(run_id)
        metrics.completions.labels(str(bool(applied)).lower()).inc()
        return json_response({"applied": applied})
    # Claim on complete (docs/protocol.md): the next leases ride on the completion (one round trip per task).
    try:
        leases = await db.complete_and_claim(
            worker_id, token, dispatch_id, lease_token, result, claim_slots, claim_seq, live
        )
    except ItemError as e:  # refused within a group of this run's calls (awp.server.grouping): its own call's error
        raise from_sqlstate(e.sqlstate, e.message, e.detail) from None
    if run_id is not None:
        request.app[STREAMS].wake(run_id)  # its streams read the last output now (else at their next poll)
    metrics.completions.labels("true").inc()
    if claim_slots:
        metrics.claims.labels("leased" if leases else "empty").inc()
        metrics.leases_issued.inc(len(leases))
    return json_response({"applied": True, "leases": leases})


def _parse_completions(body: dict[str, Any]) -> tuple[list[dict[str, Any]], int, int | None]:
    only_fields(body, required=("results",), optional=("claim_slots", "claim_seq"))
    items = body["results"]
    if not isinstance(items, list) or not 1 <= len(items) <= MAX_BATCH_RESULTS:
        raise bad_request(
            f"results must be a list of 1-{MAX_BATCH_RESULTS} {{dispatch_id, lease_token, result}} objects"
        )
    seen: set[str] = set()
    for item in items:
        if not isinstance(item, dict):
            raise bad_request("each result must be an object {dispatch_id, lease_token, result}")
        only_fields(item, required=("dispatch_id", "lease_token", "result"), optional=("live_output",))
        dispatch_id = as_str(item["dispatch_id"], "dispatch_id")
        if dispatch_id in seen:
            raise bad_request(f"dispatch {dispatch_id} appears twice")
        seen.add(dispatch_id)
        as_str(item["lease_token"], "lease_token")
        _check_result_shape(item["result"])
        _live_output(item, f"results[{dispatch_id}].")
    claim_slots = as_int(body["claim_slots"], "claim_slots", 0, 1000) if "claim_slots" in body else 0
    return items, claim_slots, _claim_seq(body)


@route("POST", API + "/workers/{worker_id}/completions", Access.WORKER)
async def complete_many(request: web.Request) -> web.Response:
    """Several results (and the next leases) in one request and one transaction: each result is answered on
    its own (``applied`` or the error complete would give), a bad one does not spoil the others."""
    worker_id, token, (items, claim_slots, claim_seq) = await worker_request(request, _parse_completions)
    db, metrics = request.app[DB], request.app[METRICS]
    live = [
        {**w, "dispatch_id": item["dispatch_id"], "lease_token": item["lease_token"]}
        for item in items
        for w in item.pop("live_output", ())
    ]
    # The leases' last output goes in before their results (docs/progress.md), here by a call of its own: shared by
    # many leases, it runs beside the completions of their runs (a run's completions queue on its lock) instead of
    # inside them (measured: docs/progress.md, Cost on the hot path).
    if live:
        await write_progress(request, worker_id, token, live)
    answer = await db.complete_tasks(worker_id, token, items, claim_slots, claim_seq)
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


RELEASE_REASONS = ("worker_shutdown",)  # = awp._release_reasons() (db/functions/release_lease.sql)


def _parse_release(body: dict[str, Any]) -> tuple[str, str]:
    only_fields(body, required=("lease_token", "reason"))
    lease_token = as_str(body["lease_token"], "lease_token")
    reason = as_str(body["reason"], "reason", 64)
    if reason not in RELEASE_REASONS:
        raise bad_request(f"reason must be one of: {', '.join(RELEASE_REASONS)}")
    return lease_token, reason


@route("POST", API + "/workers/{worker_id}/leases/{dispatch_id}/release", Access.WORKER)
async def release(request: web.Request) -> web.Response:
    """Drain without loss (docs/protocol.md, Drain): a lease its worker gives up goes back to the queue at once,
    its attempt not counted against max_attempts."""
    worker_id, token, (lease_token, reason) = await worker_request(request, _parse_release)
    dispatch_id = path_param(request, "dispatch_id")
    task_status = await request.app[DB].release_lease(worker_id, token, dispatch_id, lease_token, reason)
    return json_response({"released": True, "task_status": task_status})


@route("POST", API + "/workers/{worker_id}/drain", Access.WORKER)
async def drain(request: web.Request) -> web.Response:
    """The worker's own drain (its session token), or an operator's (the operator token: the worker drains at its
    next heartbeat); the viewer token may not."""
    role = role_of(request.app[CONFIG], bearer_token(request) or "")
    if role is Role.OPERATOR:
        worker_id = path_param(request, "worker_id")
        only_fields(await json_body(request, allow_empty=True))
        return json_response(await request.app[DB].request_drain(worker_id))
    if role is Role.VIEWER:
        raise ApiError.of(403, "the viewer token may not drain a worker (the operator token or the worker's own may)")
    worker_id, token, _ = await worker_request(request, lambda body: only_fields(body), allow_empty=True)
    return json_response(await request.app[DB].drain_worker(worker_id, token))


@route("GET", API + "/workers", Access.READ)
async def list_workers(request: web.Request) -> web.Response:
    limit = page_limit(request)
    after_registered_at, after_worker_id = cursor_key(request, "ts", "str")
    rows = await request.app[DB].list_workers(after_registered_at, after_worker_id, limit + 1)
    return json_response(keyset_page(rows, limit, lambda r: [iso(r["registered_at"]), r["worker_id"]]))


@route("GET", API + "/workers/{worker_id}", Access.READ)
async def get_worker(request: web.Request) -> web.Response:
    return json_response(await request.app[DB].get_worker(path_param(request, "worker_id")))


# cluster status (`awp status`; docs/limits.md)


@route("GET", API + "/status", Access.READ)
async def cluster_status(request: web.Request) -> web.Response:
    """One screen of the cluster: workers and slots by executor kind, live dispatches against dispatch_limit,
    the oldest waiting task and why, and the time of the latest coordinator pass (awp.cluster_status)."""
    return json_response(await request.app[DB].cluster_status())
