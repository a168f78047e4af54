"""Median time of one awp.claim_tasks / awp.heartbeat / awp.complete_task call, straight over SQL.

    python benchmarks/sql_calls.py [--calls 1000] [--dsn DSN]

Without --dsn it starts a throwaway cluster (fsync on, like production) and a fresh migrated
database. Each call is timed from the client (one round trip over 127.0.0.1); results are printed
as a table and written to benchmarks/results/sql_calls.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
from psycopg.rows import dict_row

from awp_testing.cluster import database_name, fresh_database, one, throwaway_cluster

RESULTS = Path(__file__).resolve().parent / "results"


@contextlib.contextmanager
def database(dsn: str | None) -> Iterator[str]:
    if dsn:
        yield dsn
        return
    with throwaway_cluster(fsync=True) as server:
        name = database_name("sql_calls")
        yield fresh_database(server, name)


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def measure(dsn: str, calls: int) -> dict[str, dict[str, float]]:
    with psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as c:
        c.execute("SELECT awp.configure(dispatch_limit => %s)", [calls + 10])
        tasks = [{"key": f"t{i}", "executor": "mock"} for i in range(calls)]
        c.execute(
            "SELECT * FROM awp.create_workflow_version(%s)",
            [json.dumps({"id": "sql-calls", "concurrency": 10000, "tasks": tasks})],
        )
        c.execute("SELECT awp.start_run('sql-calls')")
        w = one(c, "SELECT * FROM awp.register_worker('bench', ARRAY['mock'], 1000)")
        worker = (w["worker_id"], w["session_token"])
        c.execute("SELECT awp.coordinator_tick()")

        timings: dict[str, list[float]] = {"claim_tasks": [], "heartbeat (10 leases)": [], "complete_task": []}
        leases = []
        for _ in range(calls):
            t0 = time.perf_counter()
            leases += c.execute("SELECT * FROM awp.claim_tasks(%s, %s, 1)", worker).fetchall()
            timings["claim_tasks"].append(time.perf_counter() - t0)
        body = json.dumps([{"dispatch_id": x["dispatch_id"], "lease_token": x["lease_token"]} for x in leases[:10]])
        for _ in range(calls):
            t0 = time.perf_counter()
            c.execute("SELECT * FROM awp.heartbeat(%s, %s, %s)", [*worker, body]).fetchall()
            timings["heartbeat (10 leases)"].append(time.perf_counter() - t0)
        result = json.dumps({"kind": "success", "output": {"ok": True}})
        for lease in leases:
            t0 = time.perf_counter()
            c.execute(
                "SELECT awp.complete_task(%s, %s, %s, %s, %s)",
                [*worker, lease["dispatch_id"], lease["lease_token"], result],
            )
            timings["complete_task"].append(time.perf_counter() - t0)
    return {
        name: {
            "calls": len(xs),
            "p50_ms": statistics.median(xs) * 1000,
            "p95_ms": percentile(xs, 0.95) * 1000,
            "p99_ms": percentile(xs, 0.99) * 1000,
        }
        for name, xs in timings.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--dsn")
    args = parser.parse_args()
    with database(args.dsn) as dsn:
        results = measure(dsn, args.calls)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "sql_calls.json").write_text(json.dumps(results, indent=2) + "\n")
    print(f"{'function':<24}{'calls':>7}{'p50 ms':>9}{'p95 ms':>9}{'p99 ms':>9}")
    for name, r in results.items():
        print(f"{name:<24}{r['calls']:>7}{r['p50_ms']:>9.3f}{r['p95_ms']:>9.3f}{r['p99_ms']:>9.3f}")


if __name__ == "__main__":
    main()
