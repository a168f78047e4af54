"""``make bench`` step 13 (runs sharded behind a PL/Proxy router, docs/scale-out.md; AWP issue 43): the same work
through a router over two shards and on one database, on this one machine:

a. one run of ``single_tasks`` (1,000) mock tasks (``sleep_ms`` 0), 4 workers x 1, after an untimed warm-up run;
b. ``many_shapes[0]`` (1,000 runs x 10 tasks, run concurrency 4), started one ``awp.start_run`` call at a time from
   one connection (through the router each goes to a shard at random; ``awp.start_runs`` would put a whole batch on
   one shard), timed from the first run's start to the last run's end (the database clocks of one machine);
c. the cost of one call: ``awp.run_revision`` from one client, ``call_samples`` times, through the router and on
   the run's shard directly.

Four PostgreSQL clusters of their own, fsync on: a router and two shards (set up as ``awp router init`` does), and
one database. Each setup has its own ``awp serve`` (the router's with ``--shard-url`` for each shard, so a
coordinator and a LISTEN session per shard); the 4 workers run against one setup at a time, rounds alternating
(router, one, one, router, ...). Each setup ends with ``awp.check_invariants()`` on each of its databases.
On one machine the router cannot be faster: three servers share the cores and every call crosses one more
connection. The ratio and the per-call cost are what docs/performance.md (Sharding) reads for N machines.
"""

from __future__ import annotations

import contextlib
import logging
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
from procs import Gateway, Reaper, WorkerPool
from psycopg.types.json import Jsonb

from awp.dev import router as router_setup
from awp.dev.migrate import migrate
from awp_testing.cluster import local_cluster

log = logging.getLogger("bench")

CALL_SAMPLES = 2000


class Setup:
    """One side: its databases (where the runs live), the connection that starts runs, its gateway and workers."""

    def __init__(self, label: str, api_dsn: str, homes: list[str], gateway: Gateway, workdir: Path, reaper: Reaper):
        self.label = label
        self.api = psycopg.connect(api_dsn, autocommit=True)
        self.homes = [psycopg.connect(d, autocommit=True) for d in homes]
        self.gateway = gateway
        self.pool = WorkerPool(reaper, gateway, workdir, self.homes[0])  # shard 0 knows every worker
        self.workflows: set[str] = set()

    def workflow(self, wid: str, tasks: int, concurrency: int) -> str:
        if wid not in self.workflows:
            tasks_ = [{"key": f"t{i:05d}", "executor": "mock", "input": {"sleep_ms": 0}} for i in range(tasks)]
            self.api.execute(
                "SELECT * FROM awp.create_workflow_version(%s)",
                [Jsonb({"id": wid, "concurrency": concurrency, "tasks": tasks_})],
            )
            self.workflows.add(wid)
        return wid

    def run(self, wid: str, runs: int, tasks_per_run: int, timeout: float) -> float:
        """``runs`` runs of ``wid`` started one call at a time; tasks/s from the first start to the last end."""
        ids = [self.api.execute("SELECT awp.start_run(%s)", [wid]).fetchone()[0] for _ in range(runs)]  # type: ignore[index]
        deadline = time.monotonic() + timeout
        while True:
            live = sum(
                c.execute(
                    "SELECT count(*) FROM awp.runs WHERE run_id = ANY(%s) AND finished_at IS NULL", [ids]
                ).fetchone()[0]  # type: ignore[index]
                for c in self.homes
            )
            if not live:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.label}: {live} of {runs} runs of {wid} unfinished after {timeout:.0f}s")
            time.sleep(0.05)
        rows = [
            r
            for c in self.homes
            for r in c.execute(
                "SELECT status, started_at, finished_at FROM awp.runs WHERE run_id = ANY(%s)", [ids]
            ).fetchall()
        ]
        bad = [r[0] for r in rows if r[0] != "succeeded"]
        if bad or len(rows) != runs:
            raise RuntimeError(f"{self.label}: {len(rows)} of {runs} runs found, not succeeded: {bad[:5]}")
        span = (max(r[2] for r in rows) - min(r[1] for r in rows)).total_seconds()
        return runs * tasks_per_run / span if span > 0 else 0.0

    def invariants(self) -> int:
        return sum(len(c.execute("SELECT * FROM awp.check_invariants()").fetchall()) for c in self.homes)

    def close(self) -> None:
        self.pool.resize(0)
        self.gateway.stop()
        for c in (self.api, *self.homes):
            c.close()


@contextlib.contextmanager
def _setups(workdir: Path, reaper: Reaper) -> Iterator[tuple[Setup, Setup, list[str]]]:
    with contextlib.ExitStack() as stack:
        router, s0, s1, one = (
            stack.enter_context(local_cluster(fsync=True, prefix=f"awp-bench-{n}-"))
            for n in ("router", "shard0", "shard1", "one")
        )
        shards = [s0.create_database("awp"), s1.create_database("awp")]
        router_dsn = router.create_database("awp")
        router_setup.init(router_dsn, shards)
        one_dsn = one.create_database("awp")
        migrate(one_dsn)
        made: list[Setup] = []
        try:
            for label, api, homes, extra in (
                ("router + 2 shards", router_dsn, shards, tuple(a for d in shards for a in ("--shard-url", d))),
                ("one database", one_dsn, [one_dsn], ()),
            ):
                sub = workdir / label.replace(" ", "-").replace("+", "")
                sub.mkdir(parents=True, exist_ok=True)
                gw = Gateway(reaper, api, sub, extra_args=extra)
                gw.start()
                made.append(Setup(label, api, homes, gw, sub, reaper))
            yield made[0], made[1], shards
        finally:
            for s in made:
                with contextlib.suppress(Exception):
                    s.close()


def _per_call_us(dsn: str, run_id: str, n: int) -> float:
    with psycopg.connect(dsn, autocommit=True) as c:
        for _ in range(100):
            c.execute("SELECT * FROM awp.run_revision(%s)", [run_id]).fetchall()
        t0 = time.perf_counter()
        for _ in range(n):
            c.execute("SELECT * FROM awp.run_revision(%s)", [run_id]).fetchall()
        return (time.perf_counter() - t0) / n * 1e6


def measure(plan: Any, workdir: Path, reaper: Reaper) -> dict[str, Any]:
    """Step 13: {"scenarios": [{label, router, one, ratio, rounds}], "per_call_us": {...}, "invariants": {...}}."""
    started = time.monotonic()
    single = plan.single_tasks
    many_runs, many_tasks = plan.many_shapes[0]
    rounds = 2
    out: dict[str, Any] = {"scenarios": [], "status": "ok"}
    try:
        with _setups(workdir / "sharded", reaper) as (routed, one, shard_dsns):
            shapes = [
                (f"1 run x {single:,} tasks", "bench-sh-single", 1, single, single),
                (f"{many_runs:,} runs x {many_tasks} tasks", "bench-sh-many", many_runs, many_tasks, 4),
            ]
            for label, wid, runs, tasks, conc in shapes:
                figures: dict[str, list[float]] = {routed.label: [], one.label: []}
                for i in range(rounds):
                    for side in (routed, one) if i % 2 == 0 else (one, routed):
                        other = one if side is routed else routed
                        other.pool.resize(0)
                        side.pool.resize(plan.many_workers, 1)
                        if "bench-sh-warm" not in side.workflows:  # untimed: fresh backends, plan caches
                            side.run(side.workflow("bench-sh-warm", 200, 200), 1, 200, 120)
                        side.workflow(wid, tasks, conc)
                        rate = side.run(wid, runs, tasks, max(120.0, runs * tasks / 10))
                        figures[side.label].append(rate)
                        log.info("  step 13, %s, %s, round %d/%d: %.0f tasks/s", label, side.label, i + 1, rounds, rate)
                r, o = (statistics.median(figures[s.label]) for s in (routed, one))
                out["scenarios"].append(
                    {"label": label, "router": r, "one": o, "ratio": r / o if o else None, "rounds": figures}
                )
            routed.pool.resize(0)
            one.pool.resize(0)
            run_id = routed.api.execute("SELECT awp.start_run('bench-sh-warm')").fetchone()[0]  # type: ignore[index]
            shard = int(run_id[17:19], 16)
            out["per_call_us"] = {
                "router": _per_call_us(routed.gateway.dsn, run_id, CALL_SAMPLES),
                "shard": _per_call_us(shard_dsns[shard], run_id, CALL_SAMPLES),
            }
            out["invariants"] = {"violations": routed.invariants() + one.invariants()}
            per_shard = [
                c.execute("SELECT count(*) FROM awp.runs").fetchone()[0]  # type: ignore[index]
                for c in routed.homes
            ]
            out["runs_per_shard"] = per_shard
    except Exception as e:  # recorded; the other steps' results stay
        log.exception("step 13 (sharded) failed")
        out.update(status="failed", error=f"{type(e).__name__}: {e}")
    out["elapsed_s"] = time.monotonic() - started
    return out


def lines(results: dict[str, Any]) -> list[str]:
    """Step 13 as text lines (the log and ``--sharded-only``)."""
    if results.get("status") == "failed":
        return [f"Sharded (issue 43): FAILED: {results.get('error')}"]
    out = ["Sharded (issue 43): a PL/Proxy router over 2 shards vs one database, same machine, 4 workers x 1"]
    for s in results["scenarios"]:
        out.append(
            f"  {s['label']}: router {s['router']:.0f} tasks/s, one database {s['one']:.0f} tasks/s, "
            f"ratio {s['ratio']:.2f} x"
        )
    c = results.get("per_call_us") or {}
    if c:
        out.append(
            f"  one awp.run_revision call: {c['router']:.0f} us through the router, {c['shard']:.0f} us on the shard "
            f"(+{c['router'] - c['shard']:.0f} us)"
        )
    out.append(f"  runs per shard: {results.get('runs_per_shard')}; violations: {results['invariants']['violations']}")
    return out
