"""What every part of the HTTP gateway shares: :class:`GatewayConfig` (everything ``awp serve`` passes to the
app), the typed keys of what the application holds, and the worker protocol header."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from aiohttp import web

from awp.server.authfail import DEFAULT_MAX_DELAY_MS, AuthFailures
from awp.server.coordinator import Coordinator, ShardCoordinators
from awp.server.db import Database
from awp.server.grouping import DEFAULT_LANES, DEFAULT_LOCK_WAIT_MS, RunGroups
from awp.server.listener import DispatchListener
from awp.server.metrics import Metrics
from awp.server.pools import DEFAULT_HEARTBEAT_POOL_SIZE, DEFAULT_LOCK_TIMEOUT_MS, DEFAULT_STATEMENT_TIMEOUT_MS

API = "/api/v1"
# The shortest secret (viewer, operator, bootstrap, metrics token) `awp serve` accepts, in characters.
MIN_TOKEN_LENGTH = 32
# Slow clients (docs/operations.md, Slow clients and timeouts): a connection closes when a request head takes
# longer than this to arrive (an idle new connection too), a body answers 408, an idle keep-alive closes.
DEFAULT_HEAD_TIMEOUT_MS = 10_000
DEFAULT_BODY_TIMEOUT_MS = 30_000
DEFAULT_KEEPALIVE_TIMEOUT_MS = 75_000
DEFAULT_STREAM_LIMIT = 100
DEFAULT_STREAM_POLL_MS = 250
DEFAULT_STREAM_WRITE_TIMEOUT_MS = 30_000


@dataclass(frozen=True)
class GatewayConfig:
    """Everything ``awp serve`` passes to the app."""

    database_url: str
    viewer_token: str
    operator_token: str
    bootstrap_token: str
    metrics_token: str | None = None
    # Behind PgBouncer in transaction pooling mode (docs/operations.md, Behind PgBouncer): the request pools use
    # database_url without startup options and prepared statements; the coordinator and the LISTEN connection keep
    # sessions of their own on direct_database_url (a session advisory lock and LISTEN need one).
    pgbouncer: bool = False
    direct_database_url: str | None = None
    # Behind a PL/Proxy router (docs/scale-out.md): database_url is the router's; each shard's own DSN here carries
    # that shard's coordinator and LISTEN sessions (the router has no coordinator and sends no notifications).
    shard_urls: tuple[str, ...] = ()
    pool_size: int = 10
    coordinator: bool = True
    coordinator_interval_ms: int = 1000
    claim_recheck_ms: int = 500
    retention_interval_ms: int | None = 5000  # background retention batches (None: off); docs/retention.md
    # Every request connection's lock_timeout and statement_timeout, and the heartbeat pool (docs/operations.md,
    # Timeouts and pools).
    lock_timeout_ms: int = DEFAULT_LOCK_TIMEOUT_MS
    statement_timeout_ms: int = DEFAULT_STATEMENT_TIMEOUT_MS
    heartbeat_pool_size: int = DEFAULT_HEARTBEAT_POOL_SIZE
    group_lock_wait_ms: int = (
        DEFAULT_LOCK_WAIT_MS  # a grouped completion call's lock wait (python/awp/server/grouping.py)
    )
    group_lanes: int = DEFAULT_LANES  # grouped completion calls in flight at once (python/awp/server/grouping.py)
    head_timeout_ms: int = DEFAULT_HEAD_TIMEOUT_MS
    body_timeout_ms: int = DEFAULT_BODY_TIMEOUT_MS
    keepalive_timeout_ms: int = DEFAULT_KEEPALIVE_TIMEOUT_MS
    auth_backoff_max_ms: int = DEFAULT_MAX_DELAY_MS  # the longest delay of a failed authentication (0: none)
    # GET /runs/{id}/stream (docs/progress.md): open streams at most (beyond: 503), how often one polls the database
    # when nothing woke it, and how long a write to a client that does not read may take before the stream ends.
    stream_limit: int = DEFAULT_STREAM_LIMIT
    stream_poll_ms: int = DEFAULT_STREAM_POLL_MS
    stream_write_timeout_ms: int = DEFAULT_STREAM_WRITE_TIMEOUT_MS

    @property
    def session_database_urls(self) -> list[str]:
        """The DSNs of the gateway's long-lived sessions (the coordinators', the LISTEN connections): each shard's
        behind a router, else the direct one (past a pooler) or the requests' one."""
        return list(self.shard_urls) or [self.direct_database_url or self.database_url]

    def check(self) -> None:
        """Raise ValueError when a secret is empty, shorter than MIN_TOKEN_LENGTH, or two secrets are equal."""
        secrets = {
            "viewer": self.viewer_token,
            "operator": self.operator_token,
            "worker bootstrap": self.bootstrap_token,
        }
        if self.metrics_token is not None:
            secrets["metrics"] = self.metrics_token
        for name, value in secrets.items():
            if not value or not value.strip():
                raise ValueError(f"the {name} token is empty")
            if len(value.strip()) < MIN_TOKEN_LENGTH:
                raise ValueError(
                    f"the {name} token has {len(value.strip())} characters, fewer than {MIN_TOKEN_LENGTH} "
                    "(make one with: python -c 'import secrets; print(secrets.token_urlsafe(32))')"
                )
        roles = [self.viewer_token, self.operator_token, self.bootstrap_token]
        if len(set(roles)) != len(roles):
            raise ValueError("the viewer, operator and worker bootstrap tokens must all differ")
        if self.coordinator_interval_ms < 10:
            raise ValueError("the coordinator interval must be at least 10 ms")
        if self.retention_interval_ms is not None and self.retention_interval_ms < 100:
            raise ValueError("the retention interval must be at least 100 ms")
        if self.lock_timeout_ms < 1 or self.statement_timeout_ms < 1 or self.group_lock_wait_ms < 1:
            raise ValueError("the lock and statement timeouts and the group lock wait must be at least 1 ms")
        if not 1 <= self.group_lanes <= self.pool_size:
            raise ValueError("the group lanes must be at least 1 and at most the pool size")
        if self.heartbeat_pool_size < 1:
            raise ValueError("the heartbeat pool needs at least 1 connection")
        if min(self.head_timeout_ms, self.body_timeout_ms, self.keepalive_timeout_ms) < 1:
            raise ValueError("the head, body and keep-alive timeouts must be at least 1 ms")
        if self.auth_backoff_max_ms < 0:
            raise ValueError("the authentication back-off cannot be negative")
        if self.stream_limit < 0 or self.stream_poll_ms < 10 or self.stream_write_timeout_ms < 100:
            raise ValueError(
                "the stream limit cannot be negative, the stream poll is at least 10 ms, its write timeout 100 ms"
            )


class StreamHub:
    """This gateway's open streams: their count (at most ``limit``) and the wake-up of a run's streams when this
    gateway accepted a write for that run."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.open = 0
        self._waiters: dict[str, set[asyncio.Event]] = {}

    def acquire(self) -> bool:
        if self.open >= self.limit:
            return False
        self.open += 1
        return True

    def release(self) -> None:
        self.open -= 1

    def subscribe(self, run_id: str) -> asyncio.Event:
        event = asyncio.Event()
        self._waiters.setdefault(run_id, set()).add(event)
        return event

    def unsubscribe(self, run_id: str, event: asyncio.Event) -> None:
        waiters = self._waiters.get(run_id)
        if waiters is not None:
            waiters.discard(event)
            if not waiters:
                del self._waiters[run_id]

    def wake(self, run_id: str | None) -> None:
        for event in self._waiters.get(run_id or "", ()):
            event.set()


CONFIG = web.AppKey("config", GatewayConfig)
DB = web.AppKey("db", Database)
GROUPS = web.AppKey("groups", RunGroups)  # the claim-on-complete calls, grouped (python/awp/server/grouping.py)
LISTENER = web.AppKey("listener", DispatchListener)
METRICS = web.AppKey("metrics", Metrics)
COORDINATOR = web.AppKey[Coordinator | ShardCoordinators]("coordinator")
OPENAPI = web.AppKey("openapi", bytes)
AUTH_FAILURES = web.AppKey("auth_failures", AuthFailures)
STREAMS = web.AppKey("streams", StreamHub)
