"""Throughput with the gateway's requests through PgBouncer (transaction pooling) against straight to PostgreSQL
(docs/operations.md, Behind PgBouncer; AWP issue 43): 1 run x N no-op mock tasks, 4 workers x concurrency 1 over
real HTTP, a fresh gateway per repetition, the two alternating (this machine's speed drifts within minutes), each
after a warm-up run of 100 tasks; timed from the run's start to its success.

    .venv/bin/python benchmarks/pgbouncer_ab.py [--tasks 1000] [--repeats 4]

Prints each repetition and the medians, and writes benchmarks/results/pgbouncer_ab.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from awp_testing import pgbouncer
from awp_testing.cluster import fresh_database, throwaway_cluster
from awp_testing.gateway import ServeProcess, serve

RESULTS = Path(__file__).resolve().parent / "results"


def api(gw: ServeProcess, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None) -> Any:
    r = httpx.request(method, gw.api(path), json=body, headers={**gw.auth("operator"), **(headers or {})}, timeout=30)
    r.raise_for_status()
    return r.json()


def run_once(gw: ServeProcess, wid: str, n: int) -> float:
    """Seconds from the start of a run of ``n`` mock tasks to its success."""
    tasks = [{"key": f"t{i}", "executor": "mock"} for i in range(n)]
    wf = api(gw, "POST", "/workflows", {"id": wid, "concurrency": 4, "tasks": tasks}, {"Idempotency-Key": "w" + wid})
    started = time.monotonic()
    run = api(gw, "POST", f"/workflows/{wid}/versions/{wf['version']}/runs", {}, {"Idempotency-Key": wid})
    while True:
        status = api(gw, "GET", f"/runs/{run['run_id']}")["status"]
        if status in ("succeeded", "failed", "canceled"):
            if status != "succeeded":
                raise RuntimeError(f"run {run['run_id']} {status}")
            return time.monotonic() - started
        time.sleep(0.02)


def workers(gw: ServeProcess, name: str, count: int) -> list[subprocess.Popen[bytes]]:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("AWP_")},
        "AWP_GATEWAY_URL": gw.base_url,
        "AWP_WORKER_BOOTSTRAP_TOKEN": gw.tokens.bootstrap,
    }
    cmd = [sys.executable, "-m", "awp", "worker", "--executor", "mock", "--concurrency", "1"]
    return [
        subprocess.Popen([*cmd, "--name", f"{name}-{i}"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for i in range(count)
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=4)
    args = parser.parse_args()
    results: dict[str, list[float]] = {"direct": [], "pgbouncer": []}
    with throwaway_cluster() as server:
        dsn = fresh_database(server, "pgbouncer_ab")
        with pgbouncer.pgbouncer(dsn) as port:
            envs = {
                "direct": {},
                "pgbouncer": {
                    "AWP_DATABASE_URL": pgbouncer.pooled_dsn(dsn, port),
                    "AWP_DIRECT_DATABASE_URL": dsn,
                    "AWP_PGBOUNCER": "1",
                },
            }
            for rep in range(args.repeats):
                for mode in ("direct", "pgbouncer") if rep % 2 == 0 else ("pgbouncer", "direct"):
                    with serve(dsn, env=envs[mode], coordinator_interval_ms=1000) as gw:
                        procs = workers(gw, f"{mode}{rep}", 4)
                        try:
                            run_once(gw, f"warm-{mode}-{rep}", 100)
                            seconds = run_once(gw, f"ab-{mode}-{rep}", args.tasks)
                        finally:
                            for p in procs:
                                p.terminate()
                            for p in procs:
                                p.wait(30)
                    results[mode].append(args.tasks / seconds)
                    print(f"{mode:9s} {rep + 1}/{args.repeats}: {args.tasks / seconds:.0f} tasks/s", flush=True)
    medians = {k: statistics.median(v) for k, v in results.items()}
    ratio = medians["pgbouncer"] / medians["direct"]
    print(f"direct {medians['direct']:.0f} tasks/s, through PgBouncer {medians['pgbouncer']:.0f}: {ratio:.2f} x")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "pgbouncer_ab.json").write_text(
        json.dumps({"tasks": args.tasks, "per_repetition": results, "medians": medians, "ratio": ratio}, indent=2)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
