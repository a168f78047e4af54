"""``make bench`` step 11 (rate limits, docs/limits.md): named limits hold under load, on real workers.

a. ``max_in_flight``: one run of N tasks (mock, ``sleep_ms`` 100) holding the limit ``bench-api`` (max_in_flight 50),
   run concurrency N, on 4 workers x concurrency 50 (200 slots). A sampler (its own connection, one snapshot per
   sample) counts the queued + running tasks holding the bucket every few milliseconds. Reported: the largest count
   (target: exactly 50, never more), and the share of samples at exactly 50 while the backlog lasted (from the
   first sample at 50 until fewer than 50 tasks were left), with the run's tasks/s (ideal: 50 / 0.1 s = 500/s).
b. ``per_window``: one run of enough tasks (``sleep_ms`` 0) for the whole measure, holding ``bench-rate`` (per_window
   100, window_ms 1000), same workers. From the attempts' start times (``leased_at``, the database clock), over the
   first 20 s from the first start: the most starts in any window of 1,000 ms (each window starting at a start;
   the rule: at most 100) and the rate (starts / 20 s; target: the limit holds within 1%, at most 101/s). A start
   leaving the window frees a place: the coordinator wakes then (``awp.next_wake_ms``), dispatches, a worker claims;
   that lag L (a few ms idle, about 0.1 s on a busy machine) makes the rate 100 / (1 + L) per second, since a start
   counts from its lease, not from its dispatch (counting dispatches would let claims delayed unevenly bunch up).
Each ends with ``awp.check_invariants()``.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any

import psycopg

log = logging.getLogger("bench")


def _limited_workflow(b: Any, wid: str, n: int, limit: str, sleep_ms: int) -> str:
    if wid not in b.workflows:
        task = {"executor": "mock", "input": {"sleep_ms": sleep_ms}, "limits": [limit], "timeout_ms": 600000}
        definition = {"id": wid, "concurrency": n, "tasks": [{"key": f"t{i:05d}", **task} for i in range(n)]}
        b.conn.execute("SELECT * FROM awp.create_workflow_version(%s)", [json.dumps(definition)])
        b.workflows.add(wid)
    return wid


def in_flight(b: Any, n: int, most: int, sleep_ms: int) -> dict[str, Any]:
    label = f"1 run x {n:,} tasks of {sleep_ms} ms behind max_in_flight {most}, 4 workers x concurrency 50"
    b.conn.execute("SELECT * FROM awp.set_limit('bench-api', %s)", [most])
    wid = _limited_workflow(b, f"bench-in-flight-{n}", n, "bench-api", sleep_ms)
    samples: list[tuple[int, int]] = []  # (in flight, tasks not finished)
    stop = threading.Event()

    def sample() -> None:
        with psycopg.connect(b.dsn, autocommit=True) as c:
            while not stop.is_set():
                with c.transaction():
                    c.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                    row = c.execute(
                        "SELECT count(*) FILTER (WHERE status IN ('queued', 'running')"
                        " AND limit_buckets @> '{bench-api}'),"
                        " count(*) FILTER (WHERE status NOT IN ('succeeded', 'failed', 'canceled', 'skipped'))"
                        " FROM awp.tasks WHERE run_id = ANY (SELECT run_id FROM awp.runs WHERE workflow_id = %s"
                        " AND finished_at IS NULL)",
                        [wid],
                    ).fetchone()
                assert row is not None
                samples.append((int(row[0]), int(row[1])))
                time.sleep(0.005)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        [run] = b.wait_runs(b.start_runs(wid), timeout=600)
    finally:
        stop.set()
        sampler.join(10)
    seconds = (run["finished_at"] - run["started_at"]).total_seconds()
    first = next((i for i, (f, _) in enumerate(samples) if f >= most), None)
    steady = [f for f, left in samples[first:] if left > most] if first is not None else []
    result = {
        "label": label,
        "tasks": n,
        "max_in_flight": most,
        "samples": len(samples),
        "peak": max((f for f, _ in samples), default=0),
        "steady_samples": len(steady),
        "steady_at_limit": sum(1 for f in steady if f == most) / len(steady) if steady else None,
        "steady_min": min(steady, default=None),
        "seconds": seconds,
        "tasks_per_s": n / seconds if seconds else None,
        "ideal_tasks_per_s": most / (sleep_ms / 1000.0),
        "invariants": b.invariants(label),
    }
    log.info(
        "  peak %d in flight (limit %d); %s of %d steady samples at the limit (min %s); %.0f tasks/s (ideal %.0f)",
        result["peak"],
        most,
        f"{result['steady_at_limit']:.1%}" if result["steady_at_limit"] is not None else "-",
        len(steady),
        result["steady_min"],
        result["tasks_per_s"] or 0,
        result["ideal_tasks_per_s"],
    )
    return result


def per_window(b: Any, per: int, window_ms: int, measure_s: float) -> dict[str, Any]:
    n = int(per * (measure_s * 1000 / window_ms) * 1.3) + per
    label = f"per_window {per} per {window_ms} ms over {measure_s:.0f} s (1 run x {n:,} tasks), 4 workers x 50"
    b.conn.execute("SELECT * FROM awp.set_limit('bench-rate', NULL, %s, %s)", [per, window_ms])
    wid = _limited_workflow(b, f"bench-per-window-{n}", n, "bench-rate", 0)
    [run_id] = b.start_runs(wid)
    deadline = time.monotonic() + measure_s * 2 + 60
    while True:
        row = b.conn.execute(
            "SELECT min(leased_at), max(leased_at) FROM awp.dispatches WHERE run_id = %s AND leased_at IS NOT NULL",
            [run_id],
        ).fetchone()
        if row and row[0] is not None and (row[1] - row[0]).total_seconds() > measure_s + window_ms / 1000.0:
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"{label}: fewer than {measure_s} s of starts after {measure_s * 2 + 60:.0f} s")
        time.sleep(0.5)
    b.conn.execute("SELECT * FROM awp.request_cancel(%s)", [run_id])  # the rest is not needed
    stats = b.conn.execute(
        """
        WITH s AS (SELECT leased_at AS t FROM awp.dispatches WHERE run_id = %(r)s AND leased_at IS NOT NULL),
             f AS (SELECT min(t) AS t0 FROM s)
        SELECT (SELECT count(*) FROM s, f WHERE s.t < f.t0 + make_interval(secs => %(m)s)),
               (SELECT max(w.n) FROM (SELECT count(*) OVER (ORDER BY s.t RANGE BETWEEN CURRENT ROW AND
                                                              make_interval(secs => %(w)s / 1000.0)
                                                              - interval '1 microsecond' FOLLOWING) AS n
                                        FROM s) w)
        """,
        {"r": run_id, "m": measure_s, "w": window_ms},
    ).fetchone()
    assert stats is not None
    b.wait_live(wid, timeout=120)
    starts, busiest = int(stats[0]), int(stats[1])
    rate = starts / measure_s
    target = per * 1000.0 / window_ms
    result = {
        "label": label,
        "per_window": per,
        "window_ms": window_ms,
        "measure_s": measure_s,
        "starts": starts,
        "rate_per_s": rate,
        "target_per_s": target,
        "rate_ratio": rate / target,
        "busiest_window": busiest,
        "invariants": b.invariants(label),
    }
    log.info(
        "  %d starts in %.0f s: %.1f/s (%.3f x the limit's %.0f/s); at most %d in any %d ms window (limit %d)",
        starts,
        measure_s,
        rate,
        result["rate_ratio"],
        target,
        busiest,
        window_ms,
        per,
    )
    return result


def measure(b: Any, plan: Any) -> dict[str, Any]:
    """Step 11: {"in_flight": ..., "per_window": ...}."""
    log.info("rate limits: max_in_flight 50 on 200 slots; per_window 100 per second")
    b.pool.resize(4, 50)
    try:
        return {
            "in_flight": in_flight(b, plan.pacing_tasks, 50, 100),
            "per_window": per_window(b, 100, 1000, plan.pacing_seconds),
        }
    finally:
        b.pool.resize(0)
