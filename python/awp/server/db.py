"""Database access for the control plane: two psycopg ``AsyncConnectionPool``s and one method per SQL
function of schema ``awp``. Rows come back as dicts with the SQL column names (the SQL API in docs/sql-api.md).

Every method is one statement (one round trip, one transaction in autocommit mode). Errors are
psycopg's: :mod:`awp.server.errors` maps them to HTTP answers.

Pools (docs/operations.md, Timeouts and pools): the request pool serves every route but these; a small
heartbeat pool of its own serves heartbeats, registrations, drains, session checks and the readiness ping,
so a request pool filled by completions waiting for one stuck run never holds a worker's heartbeat back.
Every connection of both pools has ``lock_timeout`` and ``statement_timeout``: a request waits for a lock
held elsewhere at most that long, then answers 503 (retryable) instead of holding its connection forever.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Any, cast

import psycopg
import psycopg_pool
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool
from psycopg_pool.base import AttemptWithBackoff

from awp.protocol.jsonio import dumps_bytes
from awp.server.grouping import DEFAULT_LANES, DEFAULT_LOCK_WAIT_MS, RunGroups

log = logging.getLogger(__name__)

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


def _jsonb(value: Any) -> Jsonb:
    """A jsonb argument, written by orjson (:func:`awp.protocol.jsonio.dumps_bytes`) instead of psycopg's default
    json.dumps."""
    return Jsonb(value, dumps=dumps_bytes)


def _waiting_at_most(argument: str, lock_wait_ms: int | None, wait: str) -> str:
    """``argument`` of a call, made to set the call's transaction's ``lock_timeout`` to the parameter ``wait`` first
    (the arguments are evaluated before the function runs: one statement, no transaction block), or as it is."""
    if lock_wait_ms is None:
        return argument
    return f"CASE WHEN set_config('lock_timeout', {wait}, true) IS NOT NULL THEN {argument} END"


class PoolSaturated(psycopg_pool.PoolTimeout):
    """No connection became free in time while every connection the pool may open was open and in use: the
    gateway is busy (e.g. requests waiting for one stuck run), the database may well be fine."""


class Database:
    """The request pool and the heartbeat pool, plus one method per SQL function."""

    def __init__(
        self,
        dsn: str,
        pool_size: int = 10,
        acquire_timeout: float = 5.0,
        *,
        heartbeat_pool_size: int = DEFAULT_HEARTBEAT_POOL_SIZE,
        lock_timeout_ms: int = DEFAULT_LOCK_TIMEOUT_MS,
        statement_timeout_ms: int = DEFAULT_STATEMENT_TIMEOUT_MS,
        group_lock_wait_ms: int = DEFAULT_LOCK_WAIT_MS,
        group_lanes: int = DEFAULT_LANES,
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
            # checked by :meth:`check_session_settings`.
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
        self.groups = RunGroups(
            self._complete_and_claim_one,
            self._complete_and_claim_many,
            lock_wait_ms=min(group_lock_wait_ms, lock_timeout_ms),
            lanes=group_lanes,
        )
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

    async def session_settings_differences(self) -> list[str]:
        """Behind PgBouncer (docs/operations.md): the settings a request connection would get from its startup
        options (UTC, the lock and statement timeouts) that a pooled server connection has otherwise, one line
        each; empty when they match."""
        rows = await self._rows(
            "SELECT name, setting FROM pg_settings WHERE name IN ('TimeZone', 'lock_timeout', 'statement_timeout')"
        )
        have = {r["name"]: r["setting"] for r in rows}
        want = {
            "TimeZone": "UTC",
            "lock_timeout": str(self.lock_timeout_ms),
            "statement_timeout": str(self.statement_timeout_ms),
        }
        return [
            f"{name} is {have.get(name)!r}, the gateway's requests expect {value!r}"
            for name, value in want.items()
            if have.get(name) != value and not (name == "TimeZone" and have.get(name) in ("Etc/UTC", "UCT", "Zulu"))
        ]

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

    # -- health and metrics -----------------------------------------------------------------------

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

    async def metrics_snapshot(self) -> dict[str, Any]:
        """awp.metrics_snapshot() plus the per-kind stats and the dispatch_limit (docs/limits.md), one statement."""
        return await self._value(
            "SELECT awp.metrics_snapshot() || jsonb_build_object('executors', awp.executor_stats(),"
            " 'dispatch_limit', awp.get_settings()->'dispatch_limit') AS s"
        )

    async def cluster_status(self) -> dict[str, Any]:
        return await self._value("SELECT awp.cluster_status() AS s")

    async def run_waits(self, run_id: str) -> list[Row]:
        return await self._rows("SELECT * FROM awp.run_waits(%s)", (run_id,))

    # -- workflows --------------------------------------------------------------------------------

    async def apply_workflow_idempotent(self, key: str, request_hash: str, definition: Any) -> Row:
        return await self._row(
            "SELECT * FROM awp.apply_workflow_idempotent(%s, %s, %s)", (key, request_hash, _jsonb(definition))
        )

    async def list_workflows(self, after: str | None = None, limit: int | None = None) -> list[Row]:
        """Workflows by id after ``after`` (a workflow_id); every one when ``limit`` is None."""
        return await self._rows("SELECT * FROM awp.list_workflows(%s::text, %s::integer)", (after, limit))

    async def get_workflow(self, workflow_id: str) -> Row:
        return await self._row("SELECT * FROM awp.get_workflow(%s)", (workflow_id,))

    async def workflow_versions(
        self, workflow_id: str, after_version: int | None = None, limit: int | None = None
    ) -> list[Row]:
        return await self._rows(
            "SELECT * FROM awp.workflow_versions(%s, %s::integer, %s::integer)", (workflow_id, after_version, limit)
        )

    async def get_workflow_version(self, workflow_id: str, version: int) -> Row:
        return await self._row("SELECT * FROM awp.get_workflow_version(%s, %s)", (workflow_id, version))

    # -- runs -------------------------------------------------------------------------------------

    async def start_run_idempotent(
        self,
        key: str,
        request_hash: str,
        workflow_id: str,
        version: int,
        run_input: dict[str, Any],
        priority: int | None = None,
    ) -> Row:
        return await self._row(
            "SELECT * FROM awp.start_run_idempotent(%s, %s, %s, %s, %s, %s::integer)",
            (key, request_hash, workflow_id, version, _jsonb(run_input), priority),
        )

    async def start_runs_idempotent(self, workflow_id: str, version: int, items: list[dict[str, Any]]) -> list[Row]:
        """``awp.start_runs_idempotent``: items {idempotency_key, request_hash, input, priority?}; one row per item."""
        return await self._rows(
            "SELECT * FROM awp.start_runs_idempotent(%s, %s, %s)", (workflow_id, version, _jsonb(items))
        )

    async def list_runs(
        self,
        workflow_id: str | None,
        status: str | None,
        after: str | None,
        limit: int,
        after_created_at: str | None = None,
    ) -> list[Row]:
        """Runs newest first after the run ``after`` (and its ``after_created_at``, ISO text, when known)."""
        return await self._rows(
            "SELECT * FROM awp.list_runs(%s, %s, %s, %s, %s::timestamptz)",
            (workflow_id, status, after, limit, after_created_at),
        )

    async def get_run(self, run_id: str) -> Row:
        return await self._row("SELECT * FROM awp.get_run(%s)", (run_id,))

    async def run_revision(self, run_id: str) -> Row:
        """The run's revision and status alone (one row read; ``get_run`` counts every task)."""
        return await self._row("SELECT * FROM awp.run_revision(%s)", (run_id,))

    async def run_tasks(self, run_id: str, after_task_key: str | None = None, limit: int | None = None) -> list[Row]:
        """The run's tasks in definition order after ``after_task_key``; every one when ``limit`` is None."""
        return await self._rows(
            "SELECT * FROM awp.run_tasks(%s, %s::text, %s::integer)", (run_id, after_task_key, limit)
        )

    async def get_task(self, run_id: str, task_key: str) -> Row:
        return await self._row("SELECT * FROM awp.get_task(%s, %s)", (run_id, task_key))

    async def run_events(self, run_id: str, after_sequence: int, limit: int) -> list[Row]:
        return await self._rows("SELECT * FROM awp.run_events(%s, %s, %s)", (run_id, after_sequence, limit))

    async def send_signal(self, run_id: str, task_key: str, payload: dict[str, Any], key: str | None) -> Row:
        return await self._row(
            "SELECT * FROM awp.send_signal(%s, %s, %s, %s)", (run_id, task_key, _jsonb(payload), key)
        )

    async def retry_run(self, run_id: str, task_keys: list[str] | None) -> Row:
        return await self._row("SELECT * FROM awp.retry_run(%s, %s::text[])", (run_id, task_keys))

    async def retry_run_idempotent(self, key: str, request_hash: str, run_id: str, task_keys: list[str] | None) -> Row:
        return await self._row(
            "SELECT * FROM awp.retry_run_idempotent(%s, %s, %s, %s::text[])", (key, request_hash, run_id, task_keys)
        )

    async def request_cancel(self, run_id: str) -> Row:
        return await self._row("SELECT * FROM awp.request_cancel(%s)", (run_id,))

    # -- schedules --------------------------------------------------------------------------------

    async def create_schedule(
        self,
        schedule_id: str,
        workflow_id: str,
        cron: str | None,
        interval_ms: int | None,
        schedule_input: dict[str, Any] | None,
        timezone: str,
    ) -> Row:
        return await self._row(
            "SELECT * FROM awp.create_schedule(%s, %s, %s, %s::integer, %s, %s)",
            (
                schedule_id,
                workflow_id,
                cron,
                interval_ms,
                None if schedule_input is None else _jsonb(schedule_input),
                timezone,
            ),
        )

    async def list_schedules(self, after: str | None = None, limit: int | None = None) -> list[Row]:
        return await self._rows("SELECT * FROM awp.list_schedules(%s::text, %s::integer)", (after, limit))

    async def delete_schedule(self, schedule_id: str) -> Row:
        return await self._row("SELECT * FROM awp.delete_schedule(%s)", (schedule_id,))

    # -- rate limits (docs/limits.md) -------------------------------------------------------------

    async def set_limit(
        self, name: str, max_in_flight: int | None, per_window: int | None, window_ms: int | None
    ) -> Row:
        return await self._row(
            "SELECT * FROM awp.set_limit(%s, %s::integer, %s::integer, %s::integer)",
            (name, max_in_flight, per_window, window_ms),
        )

    async def get_limit(self, name: str) -> Row:
        return await self._row("SELECT * FROM awp.get_limit(%s)", (name,))

    async def list_limits(self) -> list[Row]:
        return await self._rows("SELECT * FROM awp.list_limits()")

    async def delete_limit(self, name: str) -> bool:
        row = await self._row("SELECT awp.delete_limit(%s) AS deleted", (name,))
        return bool(row["deleted"])

    # -- workers ----------------------------------------------------------------------------------

    async def register_worker(
        self,
        display_name: str,
        executor_kinds: list[str],
        max_concurrency: int,
        protocol_version: int,
        actions: dict[str, list[str]] | None = None,
    ) -> Row:
        """awp.register_worker; ``actions``: the actions it runs per executor kind (routing by action), None: all."""
        return await self._row(
            "SELECT * FROM awp.register_worker(%s, %s::text[], %s, %s, %s)",
            (display_name, executor_kinds, max_concurrency, protocol_version, _jsonb(actions) if actions else None),
            self.heartbeat_pool,
        )

    async def check_worker_session(self, worker_id: str, session_token: str) -> str:
        return await self._value(
            "SELECT awp.check_worker_session(%s, %s) AS s", (worker_id, session_token), self.heartbeat_pool
        )

    async def claim_tasks(
        self, worker_id: str, session_token: str, slots: int, claim_seq: int | None = None
    ) -> list[Row]:
        leases = await self._rows(
            "SELECT * FROM awp.claim_tasks(%s, %s, %s, %s)", (worker_id, session_token, slots, claim_seq)
        )
        self.groups.remember(leases)
        return leases

    async def heartbeat(
        self,
        worker_id: str,
        session_token: str,
        leases: list[dict[str, str]],
        claimed_through: int | None = None,
        claims_pending: list[int] | None = None,
        dropped: list[dict[str, str]] | None = None,
    ) -> tuple[list[Row], str | None]:
        """awp.heartbeat (one row per listed lease) and the worker's status after it (awp.worker_status: a worker an
        operator drained sees ``draining``), in one statement; the last three are the lease recovery fields
        (docs/protocol.md, Lease recovery)."""
        row = await self._row(
            "SELECT coalesce((SELECT jsonb_agg(to_jsonb(h) ORDER BY h.o)"
            " FROM awp.heartbeat(%s, %s, %s, %s, %s::bigint[], %s) WITH ORDINALITY AS h(dispatch_id, status,"
            " lease_remaining_ms, o)), '[]'::jsonb) AS leases, awp.worker_status(%s) AS worker_status",
            (
                worker_id,
                session_token,
                _jsonb(leases),
                claimed_through,
                claims_pending,
                _jsonb(dropped) if dropped is not None else None,
                worker_id,
            ),
            self.heartbeat_pool,
        )
        rows = [{k: v for k, v in r.items() if k != "o"} for r in row["leases"]]
        return rows, row["worker_status"]

    async def complete_task(
        self,
        worker_id: str,
        session_token: str,
        dispatch_id: str,
        lease_token: str,
        result: dict[str, Any],
        live_output: list[dict[str, Any]] | None = None,
    ) -> bool:
        """``awp.complete_task``; ``live_output``: the lease's last progress writes, written first in the same
        transaction (docs/progress.md)."""
        return await self._value(
            "SELECT awp.complete_task(%s, %s, %s, %s, %s, %s) AS applied",
            (
                worker_id,
                session_token,
                dispatch_id,
                lease_token,
                _jsonb(result),
                _jsonb(live_output) if live_output else None,
            ),
        )

    async def complete_and_claim(
        self,
        worker_id: str,
        session_token: str,
        dispatch_id: str,
        lease_token: str,
        result: dict[str, Any],
        slots: int,
        claim_seq: int | None = None,
        live_output: list[dict[str, Any]] | None = None,
    ) -> list[Row]:
        """``awp.complete_and_claim``, grouped with the other calls of the same run that arrive while one is in
        flight (:mod:`awp.server.grouping`); an item the database refuses raises :class:`awp.server.grouping.ItemError`.
        ``live_output``: the lease's last progress writes, written in the same transaction before the result
        (docs/progress.md)."""
        args: dict[str, Any] = {
            "worker_id": worker_id,
            "session_token": session_token,
            "dispatch_id": dispatch_id,
            "lease_token": lease_token,
            "result": result,
            "slots": slots,
            "claim_seq": claim_seq,
        }
        if live_output:
            args["live_output"] = live_output
        leases = await self.groups.complete_and_claim(args)
        self.groups.remember(leases)
        return leases

    async def _complete_and_claim_one(self, args: dict[str, Any], lock_wait_ms: int | None = None) -> list[Row]:
        return await self._rows(
            "SELECT * FROM awp.complete_and_claim(" + _waiting_at_most("%(worker_id)s", lock_wait_ms, "%(wait)s") + ","
            " %(session_token)s, %(dispatch_id)s, %(lease_token)s, %(result)s, %(slots)s, %(claim_seq)s,"
            " %(live_output)s)",
            {
                **args,
                "result": _jsonb(args["result"]),
                "live_output": _jsonb(args["live_output"]) if args.get("live_output") else None,
                "wait": str(lock_wait_ms),
            },
        )

    async def _complete_and_claim_many(self, items: list[dict[str, Any]], lock_wait_ms: int | None = None) -> list[Row]:
        return await self._rows(
            "SELECT g.item AS group_item, g.error AS group_error, (g.lease).* FROM awp.complete_and_claim_many("
            + _waiting_at_most("%(items)s", lock_wait_ms, "%(wait)s")
            + ") g",
            {"items": _jsonb(items), "wait": str(lock_wait_ms)},
        )

    async def complete_tasks(
        self, worker_id: str, session_token: str, items: list[dict[str, Any]], slots: int, claim_seq: int | None = None
    ) -> dict[str, Any]:
        answer = await self._value(
            "SELECT awp.complete_tasks(%s, %s, %s, %s, %s) AS answer",
            (worker_id, session_token, _jsonb(items), slots, claim_seq),
        )
        self.groups.remember(answer["leases"])
        return cast(dict[str, Any], answer)

    async def drain_worker(self, worker_id: str, session_token: str) -> Row:
        return await self._row(
            "SELECT * FROM awp.drain_worker(%s, %s)", (worker_id, session_token), self.heartbeat_pool
        )

    async def release_lease(
        self, worker_id: str, session_token: str, dispatch_id: str, lease_token: str, reason: str
    ) -> str:
        """awp.release_lease: the task's new status."""
        return await self._value(
            "SELECT awp.release_lease(%s, %s, %s, %s, %s) AS task_status",
            (worker_id, session_token, dispatch_id, lease_token, reason),
            self.heartbeat_pool,
        )

    async def request_drain(self, worker_id: str) -> Row:
        """awp.request_drain: an operator's drain (the worker's summary row)."""
        return await self._row("SELECT * FROM awp.request_drain(%s)", (worker_id,))

    async def list_workers(
        self, after_registered_at: str | None = None, after_worker_id: str | None = None, limit: int | None = None
    ) -> list[Row]:
        """Workers oldest first after (``after_registered_at`` ISO text, ``after_worker_id``); all when no limit."""
        return await self._rows(
            "SELECT * FROM awp.list_workers(%s::timestamptz, %s::text, %s::integer)",
            (after_registered_at, after_worker_id, limit),
        )

    async def get_worker(self, worker_id: str) -> Row:
        return await self._row("SELECT * FROM awp.get_worker(%s)", (worker_id,))

    # -- live progress, logs and partial output (docs/progress.md) ---------------------------------

    async def report_progress(
        self,
        worker_id: str,
        session_token: str,
        dispatch_id: str,
        lease_token: str,
        progress: Any,
        has_progress: bool,
        logs: list[str] | None,
        chunks: list[str] | None,
        offset: int | None = None,
    ) -> dict[str, Any]:
        """awp.report_progress: {"seq", "truncated", "run_id"}; ``progress`` is passed when ``has_progress`` (JSON
        null too)."""
        progress_arg = _jsonb(progress) if has_progress else None
        return await self._value(
            "SELECT awp.report_progress(%s, %s, %s, %s, %s, %s::text[], %s::text[], %s::bigint) AS answer",
            (worker_id, session_token, dispatch_id, lease_token, progress_arg, logs, chunks, offset),
        )

    async def report_progress_many(self, worker_id: str, session_token: str, items: list[dict[str, Any]]) -> list[Row]:
        return await self._rows(
            "SELECT * FROM awp.report_progress_many(%s, %s, %s)", (worker_id, session_token, _jsonb(items))
        )

    async def task_logs(
        self, run_id: str, task_key: str, attempt: int | None, after_seq: int, limit: int | None
    ) -> dict[str, Any]:
        return await self._value(
            "SELECT awp.task_logs(%s, %s, %s::integer, %s::bigint, %s::integer) AS logs",
            (run_id, task_key, attempt, after_seq, limit),
        )

    async def run_stream(self, run_id: str, after_event: int, after_output: int, limit: int) -> dict[str, Any]:
        return await self._value(
            "SELECT awp.run_stream(%s, %s::bigint, %s::bigint, %s::integer) AS s",
            (run_id, after_event, after_output, limit),
        )

    # -- dashboard sessions -----------------------------------------------------------------------

    async def ui_session_revoked(self, session_id: str) -> bool:
        """Whether the dashboard session ``session_id`` was signed out (one primary-key lookup)."""
        return bool(await self._value("SELECT awp.ui_session_revoked(%s) AS r", (session_id,)))

    async def revoke_ui_session(self, session_id: str, expires_at: int) -> None:
        """Sign the dashboard session ``session_id`` out on every gateway until ``expires_at`` (Unix seconds: when
        its last cookie expires)."""
        await self._rows("SELECT awp.revoke_ui_session(%s, to_timestamp(%s)) AS r", (session_id, expires_at))


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


class DispatchListener:
    """One shared ``LISTEN awp_dispatch`` connection per gateway, feeding an in-process wake-up.

    Long-polling claim requests wait on :meth:`wait` instead of querying. The database sends one
    NOTIFY per dispatch left pending (``awp._notify_pending``), and each wakes one waiter, oldest
    first, so a new dispatch costs one claim, not one per idle worker. (Re)connecting wakes every
    waiter, since notifications may have been missed meanwhile. The notification is only a hint:
    waiters re-check the database (``claim_tasks``) after each wake-up and after their own short
    re-check period, so a lost or misdirected hint costs latency, not correctness.
    """

    CHANNEL = "awp_dispatch"

    def __init__(self, dsn: str, keepalive_s: float = 5.0) -> None:
        self.dsn = dsn
        self.keepalive_s = keepalive_s
        self.connected = False
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    def wake_one(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def wake_all(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)

    async def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for a wake-up; True when woken."""
        if self._closed:
            return False
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await asyncio.wait_for(waiter, timeout)
        except TimeoutError:
            return False
        finally:
            if not waiter.done():
                waiter.cancel()
            with contextlib.suppress(ValueError):
                self._waiters.remove(waiter)
        return True

    @property
    def closed(self) -> bool:
        return self._closed

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="awp-dispatch-listener")

    async def close(self) -> None:
        self._closed = True
        self.wake_all()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        backoff = 0.1
        while not self._closed:
            conn: psycopg.AsyncConnection[Any] | None = None
            try:
                conn = await connect(self.dsn)
                REACHABILITY.reached()
                await conn.execute(f"LISTEN {self.CHANNEL}")
                self.connected = True
                backoff = 0.1
                log.info("listening on %s", self.CHANNEL)
                self.wake_all()  # hints may have been missed while disconnected
                while not self._closed:
                    got = False
                    async for _ in conn.notifies(timeout=self.keepalive_s):
                        got = True
                        self.wake_one()
                    if not got:
                        await conn.execute("SELECT 1")  # notice a dead connection
            except (psycopg.Error, OSError) as e:
                if not self._closed:
                    REACHABILITY.failed(e)  # one line for the outage, not one per attempt
                    log.debug(
                        "dispatch listener lost its connection (%s); reconnecting in %.1fs", short_error(e), backoff
                    )
            finally:
                self.connected = False
                if conn is not None:
                    with contextlib.suppress(Exception):
                        await conn.close()
            if not self._closed:
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, RECONNECT_MAX_S)
