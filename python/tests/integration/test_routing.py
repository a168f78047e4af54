"""Routing by action (AWP issue 41, docs/protocol.md, Routing by action): python workers register the handlers they
loaded; each task lands on a worker that has its handler, and a task whose action no worker runs waits with
no_worker_for_action (the API, the CLI) until one registers. Real gateway and worker processes."""

from __future__ import annotations

import signal
from typing import Any

import psycopg
from click.testing import CliRunner
from psycopg.rows import dict_row
from worker_support import SHORT_LEASES, Workers, apply, python_task, start_run, task, wait_run

from awp.cli.main import main
from awp_testing.gateway import ServeProcess, wait_until

HANDLERS = "python/tests/handlers_routing.py"


GATEWAY_SETTINGS = SHORT_LEASES


def start_worker(ws: Workers, name: str, actions: str) -> Any:
    w = ws.start(
        name, executors="python", concurrency=2, extra=["--handlers", HANDLERS], env={"AWP_TEST_ACTIONS": actions}
    )
    w.wait_log("registered as")
    return w


def worker_ids(dsn: str) -> dict[str, str]:
    with psycopg.connect(dsn, row_factory=dict_row) as c:
        return {r["display_name"]: r["worker_id"] for r in c.execute("SELECT display_name, worker_id FROM awp.workers")}


def attempts_by_task(dsn: str, run_id: str) -> dict[str, list[tuple[str, str]]]:
    with psycopg.connect(dsn, row_factory=dict_row) as c:
        rows = c.execute(
            "SELECT task_key, worker_id, status FROM awp.attempts WHERE run_id = %s ORDER BY task_key, attempt",
            (run_id,),
        ).fetchall()
    out: dict[str, list[tuple[str, str]]] = {}
    for r in rows:
        out.setdefault(r["task_key"], []).append((r["worker_id"], r["status"]))
    return out


def test_each_task_lands_on_a_worker_with_its_handler(db_dsn: str, gw: ServeProcess) -> None:
    tasks = [python_task(f"a{i}", "route-a") for i in range(4)] + [python_task(f"b{i}", "route-b") for i in range(4)]
    wf = apply(gw, {"id": "routing", "concurrency": 8, "tasks": [*tasks, python_task("c", "route-c")]})
    runner = CliRunner()
    env = {"AWP_GATEWAY_URL": gw.base_url, "AWP_OPERATOR_TOKEN": gw.tokens.operator}
    with Workers(gw) as ws:
        a = start_worker(ws, "route-wa", "route-a")
        b = start_worker(ws, "route-wb", "route-b")
        assert "python actions: route-a" in a.log()
        run_id = start_run(gw, wf)
        waiting = wait_until(
            lambda: (t := task(gw, run_id, "c"))["wait_reason"] == "no_worker_for_action" and t, 15, 0.1, "c waits"
        )
        assert waiting["status"] == "ready"
        assert "no active worker runs action route-c of executor python" in waiting["wait_detail"], waiting
        shown = runner.invoke(main, ["run", "show", run_id], env=env, catch_exceptions=False)
        assert "no_worker_for_action" in shown.output, shown.output
        ids = worker_ids(db_dsn)
        wait_until(lambda: len(attempts_by_task(db_dsn, run_id)) == 8, 15, 0.1, "the a and b tasks ran")
        c = start_worker(ws, "route-wc", "route-c")
        assert wait_run(gw, run_id, 20)["status"] == "succeeded"
        ids = worker_ids(db_dsn)
        for key, history in attempts_by_task(db_dsn, run_id).items():
            want = ids[{"a": "route-wa", "b": "route-wb", "c": "route-wc"}[key[0]]]
            assert history == [(want, "succeeded")], (key, history)
        for w in (a, b, c):
            w.signal(signal.SIGTERM)
            assert w.wait_exit(15) == 0
