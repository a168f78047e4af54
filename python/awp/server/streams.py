"""The gateway's routes of live progress, logs and partial output (docs/progress.md; python/awp/openapi.yaml):
a worker's writes (fenced by the database like a completion), the logs of a task, and ``GET /runs/{id}/stream``,
a run's Server-Sent Events.

The stream polls ``awp.run_stream`` (one short statement on a pooled connection, released before anything is
written to the client: a client that reads slowly never holds a database connection), every ``stream_poll_ms``
or at once when this gateway accepted a write for the run. Each event's id is ``<event sequence>-<output
sequence>``: a client that reconnects with ``Last-Event-ID`` resumes after it. The stream ends with the run's final
state (``event: end``). At most ``stream_limit`` streams are open per gateway; beyond that ``503`` + Retry-After.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from typing import Any

import psycopg
import psycopg_pool
from aiohttp import web

from awp.protocol.jsonio import dumps
from awp.protocol.limits import MAX_BATCH_LEASES
from awp.protocol.statuses import RUN_TERMINAL
from awp.server.answers import json_response
from awp.server.appstate import API, CONFIG, DB, STREAMS, GatewayConfig, StreamHub
from awp.server.auth import Access
from awp.server.errors import SQLSTATE_ERRORS, ApiError, join_message
from awp.server.gateway import route, worker_request, write_progress
from awp.server.parsing import as_str, bad_request, only_fields, path_param, progress_write, query_int

log = logging.getLogger("awp.streams")  # the log's name, not the module's (docs/operations.md, Logs)

LOGS_LIMIT_MAX = 1000  # = awp._limit_page_rows()
LOGS_LIMIT_DEFAULT = 500
STREAM_BATCH = 500  # rows of each kind one poll of a stream reads
KEEPALIVE_S = 15.0  # a comment line this often keeps proxies from closing a quiet stream
EVENT_ID = re.compile(r"^(\d{1,18})-(\d{1,18})$")


def setup_streams(app: web.Application, config: GatewayConfig) -> None:
    """This gateway's stream count and wake-ups (its routes are in :data:`awp.server.gateway.ROUTES` once this module is
    imported, as :mod:`awp.server.app` does)."""
    app[STREAMS] = StreamHub(config.stream_limit)


# worker writes


def _parse_progress(body: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    only_fields(body, required=("lease_token",), optional=("progress", "logs", "chunks", "offset"))
    lease_token = as_str(body["lease_token"], "lease_token")
    if not progress_write(body):
        raise bad_request("give progress, logs or chunks")
    return lease_token, body


@route("POST", API + "/workers/{worker_id}/leases/{dispatch_id}/progress", Access.WORKER)
async def report_progress(request: web.Request) -> web.Response:
    """A lease's progress value, log lines and output chunks (awp.report_progress): fenced like complete."""
    worker_id, token, (lease_token, body) = await worker_request(request, _parse_progress)
    dispatch_id = path_param(request, "dispatch_id")
    answer = await request.app[DB].report_progress(
        worker_id,
        token,
        dispatch_id,
        lease_token,
        body.get("progress"),
        "progress" in body,
        body.get("logs"),
        body.get("chunks"),
        body.get("offset"),
    )
    request.app[STREAMS].wake(answer.get("run_id"))
    return json_response({"seq": answer["seq"], "truncated": answer["truncated"]})


def _parse_progress_many(body: dict[str, Any]) -> list[dict[str, Any]]:
    only_fields(body, required=("items",))
    items = body["items"]
    if not isinstance(items, list) or not 1 <= len(items) <= MAX_BATCH_LEASES:
        raise bad_request(f"items must be an array of 1-{MAX_BATCH_LEASES} objects")
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise bad_request("each item must be an object {dispatch_id, lease_token, progress?, logs?, chunks?}")
        only_fields(item, required=("dispatch_id", "lease_token"), optional=("progress", "logs", "chunks", "offset"))
        as_str(item["dispatch_id"], "dispatch_id")
        as_str(item["lease_token"], "lease_token")
        progress_write(item, f"items[{i}].")
    return items


@route("POST", API + "/workers/{worker_id}/progress", Access.WORKER)
async def report_progress_many(request: web.Request) -> web.Response:
    """Several leases' writes in one request (the worker's batcher), each fenced on its own."""
    worker_id, token, items = await worker_request(request, _parse_progress_many)
    rows = await write_progress(request, worker_id, token, items)
    answers = []
    for row in rows:
        error = row["error"]
        if error is None:
            answers.append({"dispatch_id": row["dispatch_id"], "seq": row["seq"], "truncated": row["truncated"]})
            continue
        status, code = SQLSTATE_ERRORS[error["sqlstate"]]
        message = join_message(error["message"], error.get("detail"))
        answers.append(
            {"dispatch_id": row["dispatch_id"], "error": {"code": code, "status": status, "message": message}}
        )
    return json_response({"items": answers})


# reads


@route("GET", API + "/runs/{run_id}/tasks/{task_key}/logs", Access.READ)
async def task_logs(request: web.Request) -> web.Response:
    """The log lines and chunks an attempt kept after ``after`` (awp.task_logs)."""
    run_id, task_key = path_param(request, "run_id"), path_param(request, "task_key")
    after = query_int(request, "after", 0, 2**62, 0)
    attempt = query_int(request, "attempt", 1, 2**31 - 1, 0) or None
    limit = query_int(request, "limit", 1, LOGS_LIMIT_MAX, LOGS_LIMIT_DEFAULT)
    return json_response(await request.app[DB].task_logs(run_id, task_key, attempt, after, limit))


def _cursor(request: web.Request) -> tuple[int, int]:
    raw = request.headers.get("Last-Event-ID") or request.query.get("last_event_id") or ""
    raw = raw.strip()
    if not raw:
        return 0, 0
    m = EVENT_ID.match(raw)
    if m is None:
        raise bad_request("Last-Event-ID must be an event id of this stream (<sequence>-<sequence>)")
    return int(m[1]), int(m[2])


def _sse(event: str, event_id: str, data: dict[str, Any]) -> bytes:
    return f"id: {event_id}\nevent: {event}\ndata: {dumps(data)}\n\n".encode()


def stream_messages(run_id: str, batch: dict[str, Any], cursor: tuple[int, int]) -> tuple[list[bytes], tuple[int, int]]:
    """The SSE messages of one ``awp.run_stream`` answer, in time order (a run's events before outputs written at
    the same instant), and the cursor after them. Attempt and dispatch events only move the cursor."""
    after_event, after_output = cursor
    items: list[tuple[str, int, int, dict[str, Any]]] = []
    for e in batch["events"]:
        items.append((e["at"], 0, e["sequence"], e))
    for o in batch["outputs"]:
        items.append((o["at"], 1, o["seq"], o))
    items.sort(key=lambda x: (x[0], x[1], x[2]))
    out: list[bytes] = []
    for _, source, seq, item in items:
        if source == 0:
            after_event = max(after_event, seq)
            kind = item["entity_type"]
            if kind == "run":
                name, data = "run", {"run_id": run_id, "status": item["to_status"]}
            elif kind == "task":
                name, data = "task", {"task_key": item["entity_key"], "status": item["to_status"]}
            else:
                continue
            data |= {"from_status": item["from_status"], "reason": item["reason"], "sequence": seq, "at": item["at"]}
        else:
            after_output = max(after_output, seq)
            name = item["kind"]
            field = {"log": "line", "chunk": "chunk", "progress": "progress"}[name]
            data = {"task_key": item["task_key"], "attempt": item["attempt"], "seq": seq, field: item["value"]}
            if name != "progress":
                data["text"] = item["value"]
            data["at"] = item["at"]
        out.append(_sse(name, f"{after_event}-{after_output}", data))
    return out, (after_event, after_output)


@route("GET", API + "/runs/{run_id}/stream", Access.READ)
async def run_stream(request: web.Request) -> web.StreamResponse:
    """A run's Server-Sent Events: state changes, progress, log lines and chunks, then ``end``."""
    run_id = path_param(request, "run_id")
    cursor = _cursor(request)
    db, hub = request.app[DB], request.app[STREAMS]
    if not hub.acquire():
        raise ApiError.of(503, f"this gateway serves at most {hub.limit} open streams; retry later")
    wake = hub.subscribe(run_id)
    try:
        batch = await db.run_stream(run_id, cursor[0], cursor[1], STREAM_BATCH)  # 404 before the stream starts
        response = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream; charset=utf-8",
                "Cache-Control": "no-cache",
                "X-Accel-Buffering": "no",
                "X-Request-Id": request["request_id"],
                "X-Content-Type-Options": "nosniff",
            }
        )
        await response.prepare(request)
        await _serve_stream(request, response, run_id, batch, cursor, wake)
        return response
    finally:
        hub.unsubscribe(run_id, wake)
        hub.release()


async def _serve_stream(
    request: web.Request,
    response: web.StreamResponse,
    run_id: str,
    batch: dict[str, Any],
    cursor: tuple[int, int],
    wake: asyncio.Event,
) -> None:
    config, db = request.app[CONFIG], request.app[DB]
    write_timeout = config.stream_write_timeout_ms / 1000
    poll = config.stream_poll_ms / 1000
    loop = asyncio.get_running_loop()
    last_write = loop.time()

    async def write(data: bytes) -> None:
        nonlocal last_write
        await asyncio.wait_for(response.write(data), write_timeout)  # a client that stops reading ends its stream
        last_write = loop.time()

    try:
        while True:
            messages, cursor = stream_messages(run_id, batch, cursor)
            if messages:
                await write(b"".join(messages))
            full = len(batch["events"]) >= STREAM_BATCH or len(batch["outputs"]) >= STREAM_BATCH
            if batch["status"] in RUN_TERMINAL and not full:
                end = {"run_id": run_id, "status": batch["status"]}
                await write(_sse("end", f"{cursor[0]}-{cursor[1]}", end))
                return
            if not full:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), poll)
                wake.clear()
                if loop.time() - last_write >= KEEPALIVE_S:
                    await write(b": keep-alive\n\n")
            transport = request.transport
            if transport is None or transport.is_closing():
                return
            batch = await db.run_stream(run_id, cursor[0], cursor[1], STREAM_BATCH)
    except (TimeoutError, ConnectionResetError):
        log.info("stream of %s ended: the client stopped reading", run_id)
    except (psycopg.Error, psycopg_pool.PoolTimeout) as e:  # the client reconnects with Last-Event-ID
        log.warning("stream of %s ended: %s", run_id, type(e).__name__)
