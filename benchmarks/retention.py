"""The retention part of ``make bench`` (docs/retention.md): bounded scrapes and the cost of pruning.

``measure(dsn, gateway_url, sizes)`` plants finished runs (each with a task and a dispatch) straight into the
tables, ``sizes`` at a time (100 then 100,000 in the full plan), and at each size times the median of

- one ``awp.metrics_snapshot()`` (what a scrape asks the database), and one ``GET /metrics`` through the gateway;
- the query it replaced (runs by status, counted over every run) for comparison;

then the cost of one full prune batch (``awp._prune_batch``: 200 five-task runs finished through the real
functions, with their attempts, dispatches and events) and how long ``awp.prune('0')`` takes to delete all the
planted runs. Standalone: ``python benchmarks/retention.py DSN GATEWAY_URL``.
"""

from __future__ import annotations

import statistics
import sys
import time
from typing import Any

import httpx
import psycopg
from psycopg.types.json import Jsonb

from awp_testing.cluster import one

TASKS = [
    {"key": "a", "executor": "mock"},
    {"key": "b", "executor": "mock", "depends_on": ["a"]},
    {"key": "c", "executor": "mock", "depends_on": ["a"]},
    {"key": "d", "executor": "mock", "depends_on": ["a"]},
    {"key": "e", "executor": "mock", "depends_on": ["b", "c", "d"]},
]
OLD_QUERY = "SELECT r.status, count(*) FROM awp.runs r GROUP BY 1"


def _median_ms(call: Any, n: int) -> float:
    times = []
    for _ in range(n):
        started = time.perf_counter()
        call()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def plant(conn: psycopg.Connection[Any], upto: int) -> None:
    """Finished runs ``run_bench_1 .. run_bench_<upto>`` (each with a canceled task and dispatch)."""
    have = one(conn, "SELECT count(*) FROM awp.runs WHERE run_id LIKE 'run_bench_%'")[0]
    conn.execute(
        'SELECT awp.create_workflow_version(\'{"id": "bench-ret", "tasks": [{"key": "a", "executor": "mock"}]}\')'
    )
    for lo in range(have + 1, upto + 1, 20_000):
        hi = min(upto, lo + 19_999)
        conn.execute(
            "INSERT INTO awp.runs (run_id, workflow_id, workflow_version, status, concurrency, created_at,"
            " started_at, finished_at) SELECT 'run_bench_' || g, 'bench-ret', 1, 'succeeded', 1,"
            " now() - interval '1 day', now() - interval '1 day', now() - interval '1 day'"
            " FROM generate_series(%s::int, %s::int) g",
            (lo, hi),
        )
        conn.execute(
            "INSERT INTO awp.tasks (run_id, task_key, ordinal, executor, action, input, depends_on, dependants,"
            " pending_deps, max_attempts, interval_ms, timeout_ms, status, updated_at, finished_at)"
            " SELECT 'run_bench_' || g, 'a', 0, 'mock', 'noop', '{}', '{}', '{}', 0, 1, 0, 1000, 'canceled',"
            " now(), now() FROM generate_series(%s::int, %s::int) g",
            (lo, hi),
        )
        conn.execute(
            "INSERT INTO awp.dispatches (dispatch_id, run_id, task_key, executor_kind, status, created_at, finished_at)"
            " SELECT 'dsp_bench_' || g, 'run_bench_' || g, 'a', 'mock', 'canceled', now(), now()"
            " FROM generate_series(%s::int, %s::int) g",
            (lo, hi),
        )
    conn.execute("SELECT awp._compact_status_counts()")
    conn.execute("VACUUM ANALYZE awp.runs")
    conn.execute("VACUUM ANALYZE awp.tasks")
    conn.execute("VACUUM ANALYZE awp.dispatches")


def full_batch(conn: psycopg.Connection[Any], n_runs: int = 200) -> dict[str, Any]:
    """Finish ``n_runs`` five-task runs through the real functions (a worker in SQL), then time one prune batch."""
    conn.execute("SELECT awp.create_workflow_version(%s)", (Jsonb({"id": "bench-batch", "tasks": TASKS}),))
    worker, token = one(conn, "SELECT worker_id, session_token FROM awp.register_worker('bench-sql', '{mock}', 100)")
    for _ in range(n_runs):
        conn.execute("SELECT awp.start_run('bench-batch')")
    while True:
        conn.execute("SELECT awp.create_dispatches()")
        leases = conn.execute(
            "SELECT dispatch_id, lease_token FROM awp.claim_tasks(%s, %s, 100)", (worker, token)
        ).fetchall()
        for dispatch_id, lease in leases:
            conn.execute(
                'SELECT awp.complete_task(%s, %s, %s, %s, \'{"kind": "success", "output": {"ok": 1}}\')',
                (worker, token, dispatch_id, lease),
            )
        left = one(conn, "SELECT count(*) FROM awp.runs WHERE workflow_id = 'bench-batch' AND status <> 'succeeded'")[0]
        if not left:
            break
        if not leases:
            time.sleep(0.05)
    conn.execute("SELECT awp.drain_worker(%s, %s)", (worker, token))
    at = one(conn, "SELECT max(finished_at) + interval '1 ms' FROM awp.runs WHERE workflow_id = 'bench-batch'")[0]
    started = time.perf_counter()
    batch = one(conn, "SELECT awp._prune_batch(%s)", (at,))[0]
    ms = (time.perf_counter() - started) * 1000
    return {k: batch[k] for k in ("runs", "tasks", "dispatches", "attempts", "events")} | {"ms": round(ms, 1)}


def measure(dsn: str, gateway_url: str, sizes: tuple[int, ...] = (100, 100_000), samples: int = 30) -> dict[str, Any]:
    out: dict[str, Any] = {"sizes": []}
    with psycopg.connect(dsn, autocommit=True) as conn, httpx.Client(timeout=30) as http:
        conn.execute("SELECT awp.configure(retention_ms => 0)")  # the background must not prune what we plant
        for size in sizes:
            plant(conn, size)
            finished = one(conn, "SELECT count(*) FROM awp.runs WHERE finished_at IS NOT NULL")[0]
            row = {
                "finished_runs": finished,
                "metrics_snapshot_ms": round(
                    _median_ms(lambda: conn.execute("SELECT awp.metrics_snapshot()"), samples), 3
                ),
                "scrape_ms": round(_median_ms(lambda: http.get(gateway_url + "/metrics"), samples), 3),
                "count_all_runs_ms": round(_median_ms(lambda: conn.execute(OLD_QUERY).fetchall(), samples), 3),
            }
            out["sizes"].append(row)
        started = time.perf_counter()
        pruned = calls = 0
        while True:
            answer = one(conn, "SELECT awp.prune('0')")[0]
            pruned += answer["runs"]
            calls += 1
            if not answer["more"]:
                break
        out["prune_all"] = {"runs": pruned, "calls": calls, "s": round(time.perf_counter() - started, 2)}
        out["full_batch"] = full_batch(conn)
        conn.execute("SELECT awp.configure(retention_ms => 604800000)")
    return out


def lines(r: dict[str, Any]) -> list[str]:
    rows = [
        f"  {s['finished_runs']:>7} finished runs: metrics_snapshot {s['metrics_snapshot_ms']:.2f} ms, "
        f"GET /metrics {s['scrape_ms']:.2f} ms (counting every run, as before: {s['count_all_runs_ms']:.2f} ms)"
        for s in r["sizes"]
    ]
    p, b = r["prune_all"], r["full_batch"]
    rows.append(f"  awp.prune('0') deleted {p['runs']} runs in {p['calls']} calls, {p['s']} s")
    rows.append(
        f"  one prune batch: {b['runs']} runs ({b['tasks']} tasks, {b['dispatches']} dispatches, {b['attempts']} "
        f"attempts, {b['events']} events) in {b['ms']} ms"
    )
    return rows


if __name__ == "__main__":
    result = measure(sys.argv[1], sys.argv[2])
    print("\n".join(lines(result)))
