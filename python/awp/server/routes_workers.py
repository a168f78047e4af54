"""The worker protocol's routes (docs/protocol.md; python/awp/openapi.yaml): register, claim (long-polling on the
dispatch listener), heartbeat, complete (alone, with claim on complete, or in batches), release and drain, and the
workers' reads.

Every lease handed out is told to the grouping of completions (:meth:`awp.server.grouping.RunGroups.remember`), which
then knows its run; a claim on complete goes through it (:class:`awp.server.grouping.RunGroups`), the other calls
straight to :class:`awp.server.db.Database`.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from awp.protocol.limits import (
    MAX_BATCH_RESULTS,
    MAX_HEARTBEAT_LIST,
    MAX_PENDING_CLAIMS,
    PROTOCOL_HEADER,
    PROTOCOL_VERSION,
)
from awp.protocol.results import RESULT_KINDS
from awp.server.answers import json_response
from awp.server.appstate import API, CONFIG, DB, GROUPS, LISTENER, METRICS, STREAMS
from awp.server.auth import Access, Role, bearer_token, role_of
from awp.server.errors import SQLSTATE_ERRORS, ApiError, from_sqlstate, join_message
from awp.server.gateway import route, worker_request, write_progress
from awp.server.grouping import ItemError
from awp.server.parsing import (
    INT32_MAX,
    as_int,
    as_str,
    bad_request,
    cursor_key,
    iso,
    json_body,
    keyset_page,
    only_fields,
    page_limit,
    path_param,
    progress_write,
)

MAX_WAIT_MS = 30_000


def _handed_out(request: web.Request, leases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``leases``, told to the grouping of completions (their runs: :meth:`awp.server.grouping.RunGroups.remember`)."""
    request.app[GROUPS].remember(leases)
    return leases


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
    leases = _handed_out(request, await db.claim_tasks(worker_id, token, slots, claim_seq))
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
            leases = _handed_out(request, await db.claim_tasks(worker_id, token, slots, claim_seq))
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
    db, groups, metrics = request.app[DB], request.app[GROUPS], request.app[METRICS]
    # The lease's last output (live_output) is written in the completion's own transaction, before its result
    # (docs/progress.md); a write the lease may no longer make is dropped.
    run_id = groups.run_of(dispatch_id) if live else None
    if claim_slots is None:
        applied = await db.complete_task(worker_id, token, dispatch_id, lease_token, result, live)
        if run_id is not None:
            request.app[STREAMS].wake(run_id)
        metrics.completions.labels(str(bool(applied)).lower()).inc()
        return json_response({"applied": applied})
    # Claim on complete (docs/protocol.md): the next leases ride on the completion (one round trip per task), the
    # call grouped with the others that arrive while one is in flight (awp.server.grouping).
    args: dict[str, Any] = {
        "worker_id": worker_id,
        "session_token": token,
        "dispatch_id": dispatch_id,
        "lease_token": lease_token,
        "result": result,
        "slots": claim_slots,
        "claim_seq": claim_seq,
    }
    if live:
        args["live_output"] = live
    try:
        leases = _handed_out(request, await groups.complete_and_claim(args))
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
    leases = _handed_out(request, answer["leases"])
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
