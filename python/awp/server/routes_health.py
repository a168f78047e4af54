"""The gateway's routes of its own state: ``/health/live``, ``/health/ready``, ``/metrics``, the OpenAPI contract,
and the cluster status (``awp status``)."""

from __future__ import annotations

import logging
from typing import Any

import psycopg
import psycopg_pool
from aiohttp import web

from awp.server.answers import json_response
from awp.server.appstate import API, COORDINATOR, DB, LISTENER, METRICS, OPENAPI
from awp.server.auth import Access
from awp.server.gateway import route
from awp.server.metrics import CONTENT_TYPE
from awp.server.pools import PoolSaturated

log = logging.getLogger("awp.gateway")  # the name of its lines before the routes were split (issue 42)


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


# cluster status (`awp status`; docs/limits.md)


@route("GET", API + "/status", Access.READ)
async def cluster_status(request: web.Request) -> web.Response:
    """One screen of the cluster: workers and slots by executor kind, live dispatches against dispatch_limit,
    the oldest waiting task and why, and the time of the latest coordinator pass (awp.cluster_status)."""
    return json_response(await request.app[DB].cluster_status())
