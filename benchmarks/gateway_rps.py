"""Requests per second of two hot gateway routes, through a real ``awp serve`` on a throwaway cluster:

- claim, empty answer (``wait_ms`` 0): the idle worker's poll;
- heartbeat with 10 leases: a busy worker's liveness call.

Each of the ``--concurrency`` client loops acts as its own worker (a worker's calls serialise on its row
in the database, and a real worker makes one call at a time).

    .venv/bin/python benchmarks/gateway_rps.py [--seconds 5] [--concurrency 16]

Prints one line per route (requests/s, p50/p99 latency) and writes benchmarks/results/gateway_rps.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import psycopg

from awp_testing.cluster import fresh_database, throwaway_cluster
from awp_testing.gateway import PROTOCOL, ServeProcess, bearer, serve

HERE = Path(__file__).resolve().parent

log = logging.getLogger("gateway_rps")


async def hammer(
    session: aiohttp.ClientSession,
    make: Callable[[int], tuple[str, dict[str, Any], dict[str, str]]],
    seconds: float,
    concurrency: int,
) -> dict[str, float]:
    latencies: list[float] = []
    errors = 0
    stop_at = time.perf_counter() + seconds

    async def loop(i: int) -> None:
        nonlocal errors
        while time.perf_counter() < stop_at:
            url, body, headers = make(i)
            started = time.perf_counter()
            async with session.post(url, json=body, headers=headers) as r:
                await r.read()
                if r.status != 200:
                    errors += 1
            latencies.append(time.perf_counter() - started)

    began = time.perf_counter()
    await asyncio.gather(*(loop(i) for i in range(concurrency)))
    elapsed = time.perf_counter() - began
    latencies.sort()
    return {
        "requests": len(latencies),
        "errors": errors,
        "rps": len(latencies) / elapsed,
        "p50_ms": statistics.median(latencies) * 1000,
        "p99_ms": latencies[int(len(latencies) * 0.99) - 1] * 1000,
    }


async def measure(gw: ServeProcess, seconds: float, concurrency: int) -> dict[str, dict[str, float]]:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as session:

        async def post(path: str, body: Any, headers: dict[str, str]) -> Any:
            async with session.post(gw.api(path), json=body, headers=headers) as r:
                assert r.status in (200, 201, 202), await r.text()
                return await r.json()

        op = {**gw.auth("operator"), "Idempotency-Key": "bench"}
        tasks = [{"key": f"t{i}", "executor": "mock"} for i in range(10 * concurrency)]
        await post("/workflows", {"id": "bench", "concurrency": 10 * concurrency, "tasks": tasks}, op)
        await post("/workflows/bench/versions/1/runs", {}, op)
        boot = gw.auth("bootstrap")
        busy: list[tuple[str, dict[str, str], list[dict[str, str]]]] = []
        for _ in range(concurrency):
            w = await post("/workers/register", {"executor_kinds": ["mock"], "max_concurrency": 10}, boot)
            headers = {**bearer(w["session_token"]), **PROTOCOL}
            leases: list[dict[str, Any]] = []
            deadline = time.monotonic() + 30
            while len(leases) < 10 and time.monotonic() < deadline:
                body = {"slots": 10 - len(leases), "wait_ms": 1000}
                leases += (await post(f"/workers/{w['worker_id']}/claims", body, headers))["leases"]
            assert len(leases) == 10, "could not lease 10 tasks"
            refs = [{"dispatch_id": x["dispatch_id"], "lease_token": x["lease_token"]} for x in leases]
            busy.append((gw.api(f"/workers/{w['worker_id']}/heartbeat"), headers, refs))
        idle: list[tuple[str, dict[str, str]]] = []
        for _ in range(concurrency):
            w = await post("/workers/register", {"executor_kinds": ["mock"], "max_concurrency": 1}, boot)
            idle.append((gw.api(f"/workers/{w['worker_id']}/claims"), {**bearer(w["session_token"]), **PROTOCOL}))

        results = {}
        results["claim_empty_wait0"] = await hammer(
            session, lambda i: (idle[i][0], {"slots": 1, "wait_ms": 0}, idle[i][1]), seconds, concurrency
        )
        results["heartbeat_10_leases"] = await hammer(
            session, lambda i: (busy[i][0], {"leases": busy[i][2]}, busy[i][1]), seconds, concurrency
        )
        return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--pool-size", type=int, default=10)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    with throwaway_cluster() as server:
        dsn = fresh_database(server, "awp_bench_gateway")
        with psycopg.connect(dsn, autocommit=True) as c:
            # Long leases and heartbeat interval: nothing expires or goes offline while we measure.
            c.execute(
                "SELECT awp.configure(lease_duration_ms => 600000, heartbeat_interval_ms => 60000,"
                " dispatch_limit => 100000)"
            )
        with serve(dsn, coordinator_interval_ms=1000, args=["--pool-size", str(args.pool_size)]) as gw:
            results = asyncio.run(measure(gw, args.seconds, args.concurrency))
    for name, r in results.items():
        log.info(
            "%-22s %8.0f req/s  p50 %6.2f ms  p99 %6.2f ms  (%d requests, %d errors, concurrency %d, %.0f s)",
            name,
            r["rps"],
            r["p50_ms"],
            r["p99_ms"],
            r["requests"],
            r["errors"],
            args.concurrency,
            args.seconds,
        )
    out = HERE / "results" / "gateway_rps.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"concurrency": args.concurrency, "seconds": args.seconds, **results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
