"""The HTTP gateway's routes (python/awp/openapi.yaml): how a route is declared, and what several route modules
share.

A route module declares each handler with :func:`route` (method, path, who may call it); :data:`ROUTES` collects
them and :mod:`awp.server.app` adds them to the application (the one way routes are registered). The route modules:

- :mod:`awp.server.routes_health`: ``/health/live``, ``/health/ready``, ``/metrics``, the contract, the cluster status;
- :mod:`awp.server.routes_runs`: workflows, runs, rate limits, schedules;
- :mod:`awp.server.routes_workers`: the worker protocol (register, claim, heartbeat, complete, release, drain) and the
  workers' reads;
- :mod:`awp.server.streams`: live progress, logs and a run's event stream.

A handler authenticates (:func:`route` checks the caller's :class:`awp.server.auth.Access`), parses and validates
(:mod:`awp.server.parsing`), calls one SQL function (:class:`awp.server.db.Database`; a claim-on-complete through
:class:`awp.server.grouping.RunGroups`), and shapes the answer (:mod:`awp.protocol.jsonio`). Errors are
:class:`awp.server.errors.ApiError`; :mod:`awp.server.middleware` turns them into the error envelope.

Routes under ``/api/v1``; ``/health/live``, ``/health/ready`` and ``/metrics`` at the root.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aiohttp import web

from awp.protocol.jsonio import bad_text
from awp.protocol.limits import PROTOCOL_HEADER, PROTOCOL_VERSION
from awp.server.appstate import DB, STREAMS
from awp.server.auth import Access, authorize, bearer_token
from awp.server.errors import ApiError
from awp.server.middleware import Handler
from awp.server.parsing import bad_request, json_body, path_param

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


def idempotency_key(request: web.Request) -> str:
    """The Idempotency-Key header of a write: 1-255 characters of UTF-8 text (else 400)."""
    key = request.headers.get("Idempotency-Key")
    if key is None or not key.strip():
        raise bad_request("the Idempotency-Key header is required")
    if len(key) > 255:
        raise bad_request("the Idempotency-Key header must have 1-255 characters")
    if bad_text(key):
        raise bad_request("the Idempotency-Key header must be UTF-8 text")
    return key


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
