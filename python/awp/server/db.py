"""The database layer of the gateway's routes: :class:`Database`, one method per SQL function of schema ``awp``, on
the connection pools of :class:`awp.server.pools.Pools`. Rows come back as dicts with the SQL column names (the SQL
API in docs/sql-api.md).

Every method is one statement (one round trip, one transaction in autocommit mode), and nothing else: no batching
policy, no cache, no call back into the layers above (the grouping of completions, :mod:`awp.server.grouping`, calls
:meth:`Database.complete_and_claim` and :meth:`Database.complete_and_claim_many`; the routes tell it the leases
handed out). Errors are psycopg's: :mod:`awp.server.errors` maps them to HTTP answers.
"""

from __future__ import annotations

from typing import Any, cast

from psycopg.types.json import Jsonb

from awp.protocol.jsonio import dumps_bytes
from awp.server.pools import Pools, Row


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


class Database(Pools):
    """One method per SQL function, each one statement on a connection of the request pool (or of the heartbeat
    pool, for the calls that must not queue behind requests)."""

    # -- settings, metrics and status ------------------------------------------------------------

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
        return await self._rows(
            "SELECT * FROM awp.claim_tasks(%s, %s, %s, %s)", (worker_id, session_token, slots, claim_seq)
        )

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

    async def complete_and_claim(self, args: dict[str, Any], lock_wait_ms: int | None = None) -> list[Row]:
        """``awp.complete_and_claim`` with its arguments by name (worker_id, session_token, dispatch_id, lease_token,
        result, slots, claim_seq, live_output?: the lease's last progress writes, written in the same transaction
        before the result, docs/progress.md); ``lock_wait_ms``: the transaction's lock_timeout, when not the
        connection's. Called by :class:`awp.server.grouping.RunGroups`."""
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

    async def complete_and_claim_many(self, items: list[dict[str, Any]], lock_wait_ms: int | None = None) -> list[Row]:
        """``awp.complete_and_claim_many``: several calls' arguments (as :meth:`complete_and_claim` takes them) in one
        transaction; rows group_item, group_error and the lease columns. Called by
        :class:`awp.server.grouping.RunGroups`."""
        return await self._rows(
            "SELECT g.item AS group_item, g.error AS group_error, (g.lease).* FROM awp.complete_and_claim_many("
            + _waiting_at_most("%(items)s", lock_wait_ms, "%(wait)s")
            + ") g",
            {"items": _jsonb(items), "wait": str(lock_wait_ms)},
        )

    async def complete_tasks(
        self, worker_id: str, session_token: str, items: list[dict[str, Any]], slots: int, claim_seq: int | None = None
    ) -> dict[str, Any]:
        """``awp.complete_tasks``: {"results": [...], "leases": [...]}."""
        answer = await self._value(
            "SELECT awp.complete_tasks(%s, %s, %s, %s, %s) AS answer",
            (worker_id, session_token, _jsonb(items), slots, claim_seq),
        )
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
