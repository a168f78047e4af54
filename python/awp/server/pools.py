"""The gateway's connections to the database: the two request pools (:class:`Pools`), whether the database is
reachable (:data:`REACHABILITY`, one log line per outage), the readiness ping, and the dedicated long-lived
connections (:func:`connect`: the coordinator's, retention's, the dispatch listener's). No SQL of the API here:
:class:`awp.server.db.Database` adds one method per SQL function on top of :class:`Pools`.

Pools (docs/operations.md, Timeouts and pools): the request pool serves every route but these; a small
heartbeat pool of its own serves heartbeats, registrations, drains, session checks and the readiness ping,
so a request pool filled by completions waiting for one stuck run never holds a worker's heartbeat back.
Every connection of both pools has ``lock_timeout`` and ``statement_timeout``: a request waits for a lock
held elsewhere at most that long, then answers 503 (retryable) instead of holding its connection forever.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Any, cast

import psycopg
import psycopg_pool
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool
from psycopg_pool.base import AttemptWithBackoff

# The outage lines keep the logger name operators know (docs/operations.md: "WARNING awp.db: database
# unreachable: ...").
log = logging.getLogger("awp.db")

Row = dict[str, Any]

# libpq options for every gateway connection: UTC timestamps, and TCP keepalives so a dead server
# or a cut network is noticed within seconds instead of hanging a connection.
CONNECTION_KWARGS: dict[str, Any] = {
    "options": "-c TimeZone=UTC",
    "connect_timeout": 5,
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 3,
    "keepalives_count": 3,
    "application_name": "awp-gateway",
}

DEFAULT_LOCK_TIMEOUT_MS = 2_000
DEFAULT_STATEMENT_TIMEOUT_MS = 10_000
DEFAULT_HEARTBEAT_POOL_SIZE = 2
SATURATED_FOR_S = 5.0  # a request pool that made a request time out is reported saturated this long


# Reconnecting after an outage (AWP issue 41): psycopg_pool waits 1 s, then twice as long after each failed attempt
# (1, 2, 4, 8, 16 s ...), so a gateway found the database back up to ~25 s after `awp db up`. Its pools retry every
# RECONNECT_MAX_S at most instead: an attempt at a database that is down costs a refused TCP connection.
RECONNECT_FIRST_S = 0.2
RECONNECT_MAX_S = 1.0


def short_error(exc: BaseException) -> str:
    """A database error as one readable line: its message's first line (psycopg's connection errors go on with a
    tab-indented hint such as "Is the server running on that host ...?", which the log would show escaped)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


class DatabaseReachability:
    """Whether this process reaches the database, as its pools, the dispatch listener and the coordinator find when
    they connect: one WARNING when it becomes unreachable and one INFO when it is back, instead of a line per
    failed attempt (which every pool, the listener and the coordinator make every second or two)."""

    def __init__(self) -> None:
        self.down_since: float | None = None

    def failed(self, exc: BaseException) -> None:
        if self.down_since is None:
            self.down_since = time.monotonic()
            log.warning(
                "database unreachable: %s (requests answer 503; reconnecting every %.0f s)",
                short_error(exc),
                RECONNECT_MAX_S,
            )

    def reached(self) -> None:
        if self.down_since is not None:
            log.info("database reachable again after %.1f s", time.monotonic() - self.down_since)
            self.down_since = None


REACHABILITY = DatabaseReachability()


def _outage_noise(record: logging.LogRecord) -> bool:
    """psycopg_pool's line per failed connection attempt (and per connection dropped in an outage) is left out:
    :data:`REACHABILITY` says once that the database is unreachable, and once that it is back."""
    return not str(record.msg).startswith(("error connecting in", "discarding closed connection", "discarding broken"))


logging.getLogger("psycopg.pool").addFilter(_outage_noise)


class _CappedAttempt(AttemptWithBackoff):
    """psycopg_pool's reconnection backoff, starting at RECONNECT_FIRST_S and capped at RECONNECT_MAX_S."""

    INITIAL_DELAY = RECONNECT_FIRST_S

    def update_delay(self, now: float) -> None:
        super().update_delay(now)
        self.delay = min(self.delay, RECONNECT_MAX_S)


class _Pool(AsyncConnectionPool):
    """An AsyncConnectionPool that reconnects at least every RECONNECT_MAX_S during an outage and reports whether
    its connection attempts reach the database (:data:`REACHABILITY`). Relies on psycopg_pool's ``_connect`` and
    ``_add_connection`` (psycopg-pool < 3.4, pyproject.toml); python/tests/faults/test_db_readiness.py holds it to
    that."""

    async def _add_connection(self, attempt: AttemptWithBackoff | None, growing: bool = False) -> None:
        await super()._add_connection(attempt or _CappedAttempt(timeout=self.reconnect_timeout), growing)

    async def _connect(self, timeout: float | None = None) -> Any:
        try:
            conn = await super()._connect(timeout)
        except Exception as e:
            REACHABILITY.failed(e)
            raise
        REACHABILITY.reached()
        return conn


def session_options(lock_timeout_ms: int, statement_timeout_ms: int) -> str:
    """libpq ``options`` of a request connection: UTC, and the two timeouts (milliseconds; 0 is no limit)."""
    return f"-c TimeZone=UTC -c lock_timeout={int(lock_timeout_ms)} -c statement_timeout={int(statement_timeout_ms)}"


class PoolSaturated(psycopg_pool.PoolTimeout):
    """No connection became free in time while every connection the pool may open was open and in use: the
    gateway is busy (e.g. requests waiting for one stuck run), the database may well be fine."""


class Pools:
    """The request pool and the heartbeat pool: which is full, whether the database failed a request lately, the
    readiness ping, and the three ways to run one statement (:meth:`_rows`, :meth:`_row`, :meth:`_value`)."""

    def __init__(
        self,
        dsn: str,
        pool_size: int = 10,
        acquire_timeout: float = 5.0,
        *,
        heartbeat_pool_size: int = DEFAULT_HEARTBEAT_POOL_SIZE,
        lock_timeout_ms: int = DEFAULT_LOCK_TIMEOUT_MS,
        statement_timeout_ms: int = DEFAULT_STATEMENT_TIMEOUT_MS,
        pgbouncer: bool = False,
    ) -> None:
        self.dsn = dsn
        self.acquire_timeout = acquire_timeout
        self.lock_timeout_ms = lock_timeout_ms
        self.statement_timeout_ms = statement_timeout_ms
        self.pgbouncer = pgbouncer
        kwargs: dict[str, Any] = {
            **CONNECTION_KWARGS,
            "options": session_options(lock_timeout_ms, statement_timeout_ms),
            "autocommit": True,
            "row_factory": dict_row,
        }
        if pgbouncer:
            # Transaction pooling (docs/operations.md, Behind PgBouncer): each statement may run on another server
            # connection, so no prepared statements, and no startup options (PgBouncer 1.18 refuses the `options`
            # parameter): the settings come from the server side (the role's, or PgBouncer's connect_query),
            # checked by :meth:`awp.server.db.Database.session_settings_differences`.
            del kwargs["options"]
            kwargs["prepare_threshold"] = None

        def pool(size: int, name: str) -> AsyncConnectionPool:
            return _Pool(
                dsn,
                min_size=1,
                max_size=max(1, size),
                open=False,
                kwargs=kwargs,
                timeout=acquire_timeout,
                reconnect_timeout=3600 * 24 * 365,  # keep trying: an outage must never shrink the pool for good
                name=name,
            )

        self.pool = pool(pool_size, "awp-gateway")
        # Heartbeats, registrations, drains, session checks, the readiness ping: short statements that never
        # wait for a run's lock, kept apart so that requests queued for the request pool cannot delay them.
        self.heartbeat_pool = pool(heartbeat_pool_size, "awp-gateway-heartbeat")
        self._checking = False
        # Connections handed to a request right now, per pool. The pool's own statistics cannot tell "every
        # connection is busy" from "the connections are being re-opened" (after a database restart they are
        # counted while they reconnect): only the first is saturation, the second is a database that is down.
        self._in_use = {id(self.pool): 0, id(self.heartbeat_pool): 0}
        self.last_failure = float("-inf")  # time.monotonic() of the last request lost to the database
        self.last_saturated = float("-inf")  # time.monotonic() of the last request that found no free connection

    def pool_full(self, pool: AsyncConnectionPool) -> bool:
        """Whether every connection ``pool`` may have is handed to a request (a new request has to queue)."""
        return self._in_use[id(pool)] >= pool.max_size

    @contextlib.asynccontextmanager
    async def _connection(self, pool: AsyncConnectionPool, timeout: float | None = None) -> AsyncIterator[Any]:
        async with pool.connection(timeout=timeout) as conn:
            self._in_use[id(pool)] += 1
            try:
                yield conn
            finally:
                self._in_use[id(pool)] -= 1

    def failed_within(self, seconds: float) -> bool:
        """Whether a request failed for want of the database in the last ``seconds``."""
        return time.monotonic() - self.last_failure < seconds

    def saturated(self) -> bool:
        """The request pool is saturated: requests queue for a connection now (every one is busy), or one
        waited in vain within the last few seconds. The database itself may be fine (see :meth:`ping`)."""
        waiting = self.pool.get_stats()["requests_waiting"] > 0
        return (waiting and self.pool_full(self.pool)) or time.monotonic() - self.last_saturated < SATURATED_FOR_S

    def pool_state(self) -> dict[str, dict[str, int]]:
        """{"requests"|"heartbeat": {max, in_use, waiting}} for /health/ready."""
        state = {}
        for name, pool in (("requests", self.pool), ("heartbeat", self.heartbeat_pool)):
            stats = pool.get_stats()
            state[name] = {
                "max": stats["pool_max"],
                "in_use": stats["pool_size"] - stats["pool_available"],
                "waiting": stats["requests_waiting"],
            }
        return state

    async def open(self) -> None:
        """Open the pools without waiting for the database (it may be down; requests answer 503)."""
        await self.pool.open(wait=False)
        await self.heartbeat_pool.open(wait=False)

    async def close(self) -> None:
        await self.heartbeat_pool.close()
        await self.pool.close()

    def connection_lost(self) -> None:
        """Called after a connection error: drop every broken idle connection in the background."""
        self.last_failure = time.monotonic()
        if self._checking:
            return
        self._checking = True

        async def check() -> None:
            try:
                for pool in (self.pool, self.heartbeat_pool):
                    await pool.check()
            except Exception:  # a check that fails is retried on the next error
                log.debug("pool check failed", exc_info=True)
            finally:
                self._checking = False

        with contextlib.suppress(RuntimeError):
            asyncio.get_running_loop().create_task(check())

    async def _rows(
        self, query: str, params: tuple[Any, ...] | dict[str, Any] = (), pool: AsyncConnectionPool | None = None
    ) -> list[Row]:
        pool = pool or self.pool
        try:
            async with self._connection(pool) as conn:
                cur = await conn.execute(query, params)
                return cast(list[Row], await cur.fetchall())  # both pools' connections use row_factory=dict_row
        except psycopg_pool.PoolTimeout as e:  # raised only while waiting for a connection
            if not self.pool_full(pool):
                raise  # it could not open one: the database is unreachable
            if pool is self.pool:
                self.last_saturated = time.monotonic()
            raise PoolSaturated(str(e)) from e

    async def _row(self, query: str, params: tuple[Any, ...] = (), pool: AsyncConnectionPool | None = None) -> Row:
        rows = await self._rows(query, params, pool)
        return rows[0]

    async def _value(self, query: str, params: tuple[Any, ...] = (), pool: AsyncConnectionPool | None = None) -> Any:
        row = await self._row(query, params, pool)
        return next(iter(row.values()))

    # -- the readiness ping ------------------------------------------------------------------------

    async def ping(self, timeout: float = 2.0) -> None:
        """Raise unless the database answers within ``timeout`` seconds (through the heartbeat pool: a full
        request pool is not a database that is down)."""
        try:
            async with self._connection(self.heartbeat_pool, timeout) as conn:
                await conn.execute("SELECT 1")
        except psycopg_pool.PoolTimeout as e:
            if self.pool_full(self.heartbeat_pool):
                raise PoolSaturated(str(e)) from e
            raise


# The long-lived dedicated connections (the coordinator's, which holds the leadership; its retention
# batches'; the LISTEN connection) notice a dead peer on both ends: libpq drops one whose sent data stays
# unacknowledged for tcp_user_timeout (besides the keepalives above), and the server, told the same through
# `options`, ends a session whose client vanished: keepalives while it is idle, client_connection_check_interval
# while a statement runs. A frozen client (its kernel still answers) is the leader lease's business
# (db/functions/leadership.sql). The server settings need PostgreSQL 14 or later.
TCP_USER_TIMEOUT_MS = 10_000
LONG_LIVED_KWARGS: dict[str, Any] = {
    **CONNECTION_KWARGS,
    "tcp_user_timeout": TCP_USER_TIMEOUT_MS,
    "options": " ".join(
        (
            "-c TimeZone=UTC",
            "-c client_connection_check_interval=2000",
            f"-c tcp_keepalives_idle={CONNECTION_KWARGS['keepalives_idle']}",
            f"-c tcp_keepalives_interval={CONNECTION_KWARGS['keepalives_interval']}",
            f"-c tcp_keepalives_count={CONNECTION_KWARGS['keepalives_count']}",
            f"-c tcp_user_timeout={TCP_USER_TIMEOUT_MS}",
        )
    ),
}


async def connect(dsn: str) -> psycopg.AsyncConnection[Any]:
    """A dedicated autocommit connection (LISTEN, leadership, retention) with the long-lived options."""
    return await psycopg.AsyncConnection.connect(dsn, autocommit=True, **LONG_LIVED_KWARGS)
