"""Drain without loss (AWP issue 41, docs/protocol.md, Drain): a worker SIGTERMed with a task it cannot finish within
its --shutdown-timeout gives the lease back; the task runs to success on another worker even with max_attempts 1,
the abandoned attempt not counted (worker_shutdown), and the worker ends stopped. An operator drains a worker over
HTTP (the operator token) or with `awp worker drain`; the worker sees it at its next heartbeat. Real processes."""

from __future__ import annotations

import signal
import time
from typing import Any

import httpx
import psycopg
from click.testing import CliRunner
from psycopg.rows import dict_row
from worker_support import SHORT_LEASES, Workers, apply, python_task, start_run, wait_run

from awp.cli.main import main
from awp_testing.gateway import ServeProcess, wait_until

HANDLERS = "python/tests/handlers_for_tests.py"


GATEWAY_SETTINGS = SHORT_LEASES


def query(dsn: str, sql: str, args: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
    with psycopg.connect(dsn, row_factory=dict_row) as c:
        return c.execute(sql, args).fetchall()


def worker_row(dsn: str, name: str) -> dict[str, Any]:
    rows = query(dsn, "SELECT worker_id, status FROM awp.workers WHERE display_name = %s", (name,))
    assert len(rows) == 1, rows
    return rows[0]


def start_python_worker(ws: Workers, name: str, shutdown_timeout: float = 10.0) -> Any:
    w = ws.start(
        name,
        executors="python",
        concurrency=1,
        shutdown_timeout=shutdown_timeout,
        extra=["--handlers", HANDLERS],
    )
    w.wait_log("registered as")
    return w


def test_sigterm_gives_back_a_task_it_cannot_finish(db_dsn: str, gw: ServeProcess) -> None:
    wf = apply(gw, {"id": "drain-loss", "tasks": [python_task("long", "test-slow-first", seconds=60)]})
    with Workers(gw) as ws:
        a = start_python_worker(ws, "drain-a", shutdown_timeout=2.0)
        run_id = start_run(gw, wf)
        a.wait_log("claimed")
        b = start_python_worker(ws, "drain-b")
        a_id, b_id = worker_row(db_dsn, "drain-a")["worker_id"], worker_row(db_dsn, "drain-b")["worker_id"]
        a.signal(signal.SIGTERM)
        signalled = time.monotonic()
        assert a.wait_exit(20) == 0, a.log()
        exited = time.monotonic() - signalled
        assert 2.0 <= exited < 10.0, exited  # it waited for the shutdown timeout, then released and stopped
        assert "released" in a.log() and "due again at once" in a.log(), a.log()[-2000:]
        assert worker_row(db_dsn, "drain-a")["status"] == "stopped"
        run = wait_run(gw, run_id, 20)
        assert run["status"] == "succeeded", run
        b.signal(signal.SIGTERM)
        assert b.wait_exit(15) == 0
    attempts = query(
        db_dsn,
        "SELECT attempt, worker_id, status, counted, error_code FROM awp.attempts WHERE run_id = %s ORDER BY attempt",
        (run_id,),
    )
    assert [(x["worker_id"], x["status"], x["counted"], x["error_code"]) for x in attempts] == [
        (a_id, "interrupted", False, "worker_shutdown"),
        (b_id, "succeeded", True, None),
    ]
    reasons = query(
        db_dsn,
        "SELECT reason FROM awp.events WHERE run_id = %s AND entity_type = 'task' AND to_status = 'waiting_retry'",
        (run_id,),
    )
    assert reasons == [{"reason": "released by its worker (worker_shutdown)"}]
    assert query(db_dsn, "SELECT count(*) AS n FROM awp.check_invariants(ARRAY[%s])", (run_id,)) == [{"n": 0}]


def test_operator_drain_over_http_and_cli(db_dsn: str, gw: ServeProcess) -> None:
    wf = apply(gw, {"id": "drain-op", "tasks": [python_task("short", "test-sync-sleep", seconds=1.5)]})
    runner = CliRunner()
    env = {"AWP_GATEWAY_URL": gw.base_url, "AWP_OPERATOR_TOKEN": gw.tokens.operator}
    with Workers(gw) as ws:
        busy = start_python_worker(ws, "drain-op-busy")
        run_id = start_run(gw, wf)
        busy.wait_log("claimed")
        busy_id = worker_row(db_dsn, "drain-op-busy")["worker_id"]
        url = gw.api(f"/workers/{busy_id}/drain")
        viewer = httpx.post(url, json={}, headers=gw.auth("viewer"), timeout=10)
        assert viewer.status_code == 403 and "operator token" in viewer.json()["error"]["message"], viewer.text
        missing = httpx.post(gw.api("/workers/wkr_nope/drain"), headers=gw.auth("operator"), timeout=10)
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found", missing.text
        answer = httpx.post(url, headers=gw.auth("operator"), timeout=10)
        assert answer.status_code == 200, answer.text
        assert (answer.json()["status"], answer.json()["active_leases"]) == ("draining", 1)
        busy.wait_log("an operator drained this worker", 5)
        assert busy.wait_exit(15) == 0, busy.log()
        assert worker_row(db_dsn, "drain-op-busy")["status"] == "stopped"
        assert wait_run(gw, run_id, 10)["status"] == "succeeded"  # its task finished on it: nothing lost
        ran_on = query(db_dsn, "SELECT worker_id, status FROM awp.attempts WHERE run_id = %s", (run_id,))
        assert ran_on == [{"worker_id": busy_id, "status": "succeeded"}]

        idle = start_python_worker(ws, "drain-op-idle")
        idle_id = worker_row(db_dsn, "drain-op-idle")["worker_id"]
        result = runner.invoke(main, ["worker", "drain", idle_id], env=env, catch_exceptions=False)
        assert result.exit_code == 0, result.output
        assert f"worker {idle_id} (drain-op-idle) is draining" in result.output
        assert idle.wait_exit(15) == 0, idle.log()
        wait_until(lambda: worker_row(db_dsn, "drain-op-idle")["status"] == "stopped", 5, 0.1, "idle worker stopped")
        again = runner.invoke(main, ["worker", "drain", idle_id, "--json"], env=env, catch_exceptions=False)
        assert again.exit_code == 0 and '"status": "stopped"' in again.output, again.output
        unknown = runner.invoke(main, ["worker", "drain", "wkr_nope"], env=env, catch_exceptions=False)
        assert unknown.exit_code != 0 and "not_found" in unknown.output + str(unknown.stderr_bytes or b""), (
            unknown.output
        )
