"""The gateway's routes of workflows, runs, rate limits and schedules (python/awp/openapi.yaml): what a user or an
operator writes and reads."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from awp.protocol.jsonio import canonical_hash
from awp.protocol.limits import MAX_BATCH_RUNS, WORKFLOW_BODY_LIMIT
from awp.server.answers import json_response
from awp.server.appstate import API, DB
from awp.server.auth import Access
from awp.server.errors import ApiError
from awp.server.gateway import idempotency_key, route
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
    query_int,
    query_str,
)

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
