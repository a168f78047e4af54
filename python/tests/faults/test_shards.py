"""Runs sharded over two PostgreSQL clusters behind a PL/Proxy router (issue 43, part 3; docs/scale-out.md).

Three clusters on this machine (a router and two shards, each a cluster of its own), ``awp router init``'s setup,
one ``awp serve`` on the router's DSN with ``--shard-url`` for each shard (a coordinator and a LISTEN session per
shard), and workers that know nothing of shards. Runs with DAGs are started through the gateway; mid-run a worker
and then the gateway are killed with kill -9 and restarted. Then, on each shard: every run succeeded, runs went to
both shards (neither under 30%), ``awp.check_invariants()`` is empty, no task has two successful attempts; and no
run the gateway acknowledged is missing.

``make shard-test`` runs 200 runs (``AWP_SHARD_RUNS``) and prints as its last line
``shards: 2 runs 200 succeeded 200 lost 0 violations 0`` (written to ``AWP_SHARD_SUMMARY`` too); ``make test``
runs 40.
"""

from __future__ import annotations

import os
import random
import re
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from fault_support import HEARTBEAT_MS, LEASE_MS, configure, query
from shard_support import Sharded, sharded
from worker_support import Workers

from awp_testing.gateway import ServeProcess, Tokens, start_serve, wait_until

pytestmark = pytest.mark.slow

RUNS = int(os.environ.get("AWP_SHARD_RUNS", "40"))
SUMMARY = os.environ.get("AWP_SHARD_SUMMARY")


def start_gateway(env: Sharded, tokens: Tokens, port: int | None = None) -> ServeProcess:
    args = [a for d in env.shard_gateways for a in ("--shard-url", d)]
    return start_serve(env.router_gateway, tokens=tokens, args=args, port=port, coordinator_interval_ms=200)


def api(gw: ServeProcess, method: str, path: str, body: Any = None, key: str | None = None) -> Any:
    headers = {**gw.auth("operator"), **({"Idempotency-Key": key} if key else {})}
    for _ in range(100):  # the gateway may be restarting: retry connection errors and 503s
        try:
            r = httpx.request(method, gw.api(path), json=body, headers=headers, timeout=10.0)
        except httpx.TransportError:
            time.sleep(0.2)
            continue
        if r.status_code == 503:
            time.sleep(0.2)
            continue
        assert r.status_code < 400, f"{method} {path}: {r.status_code} {r.text}"
        return r.json()
    raise AssertionError(f"{method} {path}: the gateway did not answer")


def dag(n: int) -> dict[str, Any]:
    """A diamond with a tail: a -> (b, c, d) -> e -> f; mock tasks of 10-150 ms."""
    rng = random.Random(n)

    def task(key: str, deps: list[str]) -> dict[str, Any]:
        return {
            "key": key,
            "executor": "mock",
            "input": {"sleep_ms": rng.randint(10, 150)},
            "depends_on": deps,
            "retry": {"max_attempts": 20, "interval_ms": 50},
            "timeout_ms": 30000,
        }

    return {
        "id": f"sharded-{n}",
        "concurrency": 3,
        "tasks": [
            task("a", []),
            task("b", ["a"]),
            task("c", ["a"]),
            task("d", ["a"]),
            task("e", ["b", "c", "d"]),
            task("f", ["e"]),
        ],
    }


def shard_counts(env: Sharded) -> list[dict[str, int]]:
    return [
        {r["status"]: r["n"] for r in query(d, "SELECT status, count(*)::int AS n FROM awp.runs GROUP BY 1")}
        for d in env.shard_admins
    ]


def test_runs_over_two_shards_survive_kills_of_a_worker_and_the_gateway() -> None:
    tokens = Tokens()
    with sharded(2) as env:
        configure(env.router_admin, LEASE_MS, HEARTBEAT_MS)  # through the router: on every shard
        for d in env.shard_admins:
            settings = query(d, "SELECT awp.get_settings() AS s")[0]["s"]
            assert settings["lease_duration_ms"] == LEASE_MS
        gw = start_gateway(env, tokens)
        try:
            workflows = [api(gw, "POST", "/workflows", dag(i), key=f"wf-{i}") for i in range(4)]
            # a shard's error through the router: its SQLSTATE's answer, its own message (PL/Proxy's wrapping off)
            r = httpx.get(gw.api("/runs/run_t0000000000000000000000000000000"), headers=gw.auth("viewer"))
            assert r.status_code == 404 and r.json()["error"]["code"] == "not_found", r.text
            assert "REMOTE" not in r.text and "no run run_t0000" in r.text, r.text
            with Workers(gw) as workers:
                for i in range(4):
                    workers.start(f"w{i}", concurrency=2, wait_ms=1000)
                run_ids = []
                for i in range(RUNS):
                    wf = workflows[i % len(workflows)]
                    answer = api(
                        gw, "POST", f"/workflows/{wf['workflow_id']}/versions/{wf['version']}/runs", {}, key=f"run-{i}"
                    )
                    run_ids.append(answer["run_id"])

                def done() -> int:
                    return sum(c.get("succeeded", 0) for c in shard_counts(env))

                wait_until(lambda: done() >= RUNS // 5, 120, 0.2, "a fifth of the runs to succeed")
                victim = workers.procs[0]
                victim.kill()  # kill -9 mid-run: its leases expire and are retried
                workers.start("w0-again", concurrency=2, wait_ms=1000)
                wait_until(lambda: done() >= RUNS // 2, 120, 0.2, "half of the runs to succeed")
                port = gw.port
                gw.kill()  # kill -9 of the gateway (and its coordinators) mid-run
                gw = start_gateway(env, tokens, port=port)
                wait_until(
                    lambda: done() + sum(c.get("failed", 0) for c in shard_counts(env)) >= RUNS,
                    240,
                    0.5,
                    "every run to end",
                )
                # the read API through the router: merged, keyset-paged lists and counts over both shards
                listed: list[str] = []
                cursor = None
                while True:
                    page = api(gw, "GET", "/runs?limit=37" + (f"&cursor={cursor}" if cursor else ""))
                    listed += [r["run_id"] for r in page["items"]]
                    cursor = page["next_cursor"]
                    if cursor is None:
                        break
                assert sorted(listed) == sorted(run_ids) and len(listed) == len(set(listed))
                one = api(gw, "GET", f"/runs/{run_ids[-1]}")
                assert one["status"] == "succeeded" and len(api(gw, "GET", f"/runs/{run_ids[-1]}/tasks")["items"]) == 6
                assert len(api(gw, "GET", "/workers")["items"]) >= 5
                assert api(gw, "GET", "/status")
                metrics = httpx.get(gw.url("/metrics"), timeout=10).text
                gauge = re.search(r'^awp_runs\{status="succeeded"\} (\S+)$', metrics, re.M)
                assert gauge and float(gauge.group(1)) == RUNS, metrics[:2000]
        finally:
            gw.stop()

        counts = shard_counts(env)
        succeeded = sum(c.get("succeeded", 0) for c in counts)
        found = {r["run_id"] for d in env.shard_admins for r in query(d, "SELECT run_id FROM awp.runs")}
        lost = len(set(run_ids) - found)
        violations = [v for d in env.shard_admins for v in query(d, "SELECT * FROM awp.check_invariants()")]
        twice = [
            r
            for d in env.shard_admins
            for r in query(
                d,
                "SELECT run_id, task_key, count(*)::int AS n FROM awp.attempts WHERE status = 'succeeded'"
                " GROUP BY 1, 2 HAVING count(*) > 1",
            )
        ]
        per_shard = [sum(c.values()) for c in counts]
        summary = (
            f"shards: {len(counts)} runs {len(run_ids)} succeeded {succeeded} lost {lost} violations {len(violations)}"
        )
        print(f"\nruns per shard: {per_shard}; tasks with two successful attempts: {len(twice)}\n{summary}")
        if SUMMARY:
            Path(SUMMARY).write_text(summary + "\n")
        assert succeeded == RUNS, counts
        assert lost == 0
        assert violations == [], violations
        assert twice == [], twice
        assert min(per_shard) >= 0.3 * RUNS, per_shard
        # every run's tasks are on its own shard, and its dispatches carry the shard's number
        for i, d in enumerate(env.shard_admins):
            wrong = query(
                d,
                "SELECT d.dispatch_id FROM awp.dispatches d"
                " WHERE substr(d.dispatch_id, 18, 2) <> lpad(to_hex(%s::integer), 2, '0')",
                (i,),
            )
            assert wrong == []
