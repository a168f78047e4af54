"""The aiohttp application of ``awp serve``: routes (:mod:`awp.server.gateway` and the route modules it lists), the
middleware, the dashboard, and the database pools, grouping of completions, dispatch listener and coordinator that
start and stop with it."""

from __future__ import annotations

import asyncio
import logging
from importlib import resources
from typing import Any

from aiohttp import web

from awp.protocol.limits import WORKFLOW_BODY_LIMIT
from awp.server import routes_health, routes_runs, routes_workers, streams
from awp.server.appstate import (
    AUTH_FAILURES,
    CONFIG,
    COORDINATOR,
    DB,
    GROUPS,
    LISTENER,
    METRICS,
    OPENAPI,
    GatewayConfig,
)
from awp.server.authfail import AuthFailures
from awp.server.coordinator import Coordinator, ShardCoordinators
from awp.server.db import Database
from awp.server.gateway import ROUTES
from awp.server.grouping import RunGroups
from awp.server.listener import DispatchListener
from awp.server.metrics import Metrics
from awp.server.middleware import api_middleware
from awp.server.streams import setup_streams
from awp.server.ui import setup_ui

log = logging.getLogger("awp.serve")
_BACKGROUND: set[asyncio.Task[None]] = set()  # the loop keeps only weak references to tasks
# The route modules: importing one declares its routes in awp.server.gateway.ROUTES (awp.server.gateway lists them).
ROUTE_MODULES = (routes_health, routes_runs, routes_workers, streams)


def load_openapi() -> bytes:
    return resources.files("awp").joinpath("openapi.yaml").read_bytes()


def create_app(config: GatewayConfig) -> web.Application:
    """The aiohttp application; the database, listener and coordinator start with it (cleanup_ctx)."""
    config.check()
    app = web.Application(middlewares=[api_middleware], client_max_size=WORKFLOW_BODY_LIMIT + 1)
    app[CONFIG] = config
    app[METRICS] = Metrics()
    app[AUTH_FAILURES] = AuthFailures(max_delay_s=config.auth_backoff_max_ms / 1000)
    app[DB] = Database(
        config.database_url,
        pool_size=config.pool_size,
        heartbeat_pool_size=config.heartbeat_pool_size,
        lock_timeout_ms=config.lock_timeout_ms,
        statement_timeout_ms=config.statement_timeout_ms,
        pgbouncer=config.pgbouncer,
    )
    # route -> grouping -> database: the grouping calls the database layer, never the other way round
    app[GROUPS] = RunGroups(
        app[DB].complete_and_claim,
        app[DB].complete_and_claim_many,
        on_group=app[METRICS].observe_group,
        lock_wait_ms=min(config.group_lock_wait_ms, config.lock_timeout_ms),
        lanes=config.group_lanes,
    )
    app[LISTENER] = DispatchListener(config.session_database_urls)
    app[OPENAPI] = load_openapi()
    setup_streams(app, config)
    if config.coordinator:
        metrics = app[METRICS]
        coordinators = [
            Coordinator(
                dsn,
                interval_s=config.coordinator_interval_ms / 1000,
                on_pass=metrics.observe_pass,
                on_active=lambda _active: metrics.coordinator_active.set(1 if app[COORDINATOR].active else 0),
                serving=lambda: not app[DB].failed_within(1.0),
                retention_interval_s=(
                    None if config.retention_interval_ms is None else config.retention_interval_ms / 1000
                ),
                on_retention=metrics.observe_retention,
            )
            for dsn in config.session_database_urls
        ]
        app[COORDINATOR] = ShardCoordinators(coordinators) if config.shard_urls else coordinators[0]
    for method, path, _access, handler in ROUTES:
        app.router.add_route(method, path, handler, name=handler.__name__)
    setup_ui(app)
    app.cleanup_ctx.append(_lifecycle)
    app.on_shutdown.append(_on_shutdown)
    return app


async def _lifecycle(app: web.Application) -> Any:
    await app[DB].open()
    if app[CONFIG].pgbouncer:  # in the background: the database may be down at start
        task = asyncio.get_running_loop().create_task(_check_pooled_settings(app[DB]))
        _BACKGROUND.add(task)
        task.add_done_callback(_BACKGROUND.discard)
    app[LISTENER].start()
    coordinator = app.get(COORDINATOR)
    if coordinator is not None:
        coordinator.start()
    yield
    if coordinator is not None:
        await coordinator.stop()
    await app[LISTENER].close()
    await app[DB].close()


async def _check_pooled_settings(db: Database) -> None:
    """Behind PgBouncer the request connections get their settings from the server side (the role's, or
    PgBouncer's connect_query: docs/operations.md): a WARNING for each that differs (none when the database cannot
    be reached now)."""
    try:
        differences = await db.session_settings_differences()
    except Exception as e:  # the database may be down at start: requests answer 503 until it is back
        log.info("could not check the pooled connections' settings now: %s", e)
        return
    for line in differences:
        log.warning(
            "behind PgBouncer: %s (set it on the role: ALTER ROLE ... SET, or in PgBouncer's connect_query)", line
        )


async def _on_shutdown(app: web.Application) -> None:
    """Stop accepting work: end long-polls at once (they answer an empty lease list)."""
    await app[LISTENER].close()
