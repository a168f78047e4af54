"""Issue 46 in ``make bench`` (``many_runs.py``, whose docstring says how each is measured), the scenarios of runs
that no worker serves: b. a backlog of ready tasks, c. the coordinator pass with many live runs and nothing to
dispatch, e. run starts through HTTP; each cancels its runs at the end (``cancel_waiting``)."""

from __future__ import annotations

import asyncio
import logging
import statistics
import time
import uuid
from collections import Counter
from typing import TYPE_CHECKING, Any

import aiohttp
import procs
import psycopg
from figures import median_spread, percentiles
from many_load import cpu_now

from awp_testing.cluster import one

if TYPE_CHECKING:
    from harness import Bench
    from plans import Plan

log = logging.getLogger("bench")

IDLE_KIND = "python"  # the backlog's and the coordinator pass's executor kind: the bench's workers run "mock" only
PASS_3 = "SELECT awp.coordinator_tick(false, NULL, false)"
PASS_2 = "SELECT awp.coordinator_tick()"


def cancel_waiting(b: Bench, kind: str) -> dict[str, Any]:
    """``awp.cancel_waiting_runs(kind, 1000)`` until it returns 0: how many runs, calls, seconds."""
    started = time.monotonic()
    calls = canceled = 0
    while True:
        calls += 1
        n = one(b.conn, "SELECT awp.cancel_waiting_runs(%s, 1000)", [kind])[0]
        if not n:
            break
        canceled += n
    return {"runs": canceled, "calls": calls, "s": round(time.monotonic() - started, 2)}


# ---- b. backlog -------------------------------------------------------------------------------------------


def backlog(b: Bench, plan: Plan) -> dict[str, Any]:
    n, tasks = plan.many_workers, plan.many_base_tasks
    b.pool.resize(n, 1)
    wid = b.workflow(f"bench-single-{tasks}-c{n}", tasks, n)
    backlog_wid = b.workflow(
        f"bench-backlog-{plan.backlog_tasks}-{IDLE_KIND}", plan.backlog_tasks, n, {"executor": IDLE_KIND}
    )
    run_ids: list[str] = []

    def phase(name: str) -> dict[str, Any]:
        log.info(
            "  backlog scenario, %s: %d idle claims, %d runs of %d tasks",
            name,
            plan.backlog_samples,
            plan.backlog_repeats,
            tasks,
        )
        claims = b.idle_claims(plan.backlog_samples)
        reps = [
            b.repetition(f"{name}: 1 run x {tasks:,}", wid, 1, tasks, f"{i + 1}/{plan.backlog_repeats}")
            for i in range(plan.backlog_repeats)
        ]
        ids = [rid for r in reps for rid in r["run_ids"]]
        run_ids.extend(claims["run_ids"] + ids)
        out = {
            "claim_ms": percentiles(claims["claim_ms"], (0.5, 0.95)) | {"values": claims["claim_ms"]},
            "dispatch_ms": percentiles(claims["dispatch_ms"], (0.5, 0.95)),
            "tasks_per_s": median_spread([r["tasks_per_s"] for r in reps]),
            "pg_cpu_ms_per_task": median_spread(
                [r["cpu_s"]["postgres"] * 1000 / r["tasks"] for r in reps if r["cpu_s"]["postgres"] is not None]
            ),
            "gateway_cpu_ms_per_task": median_spread([r["cpu_s"]["gateway"] * 1000 / r["tasks"] for r in reps]),
        }
        log.info(
            "  backlog scenario, %s: claim p50 %.1f ms; %.0f tasks/s, PostgreSQL %.2f ms/task",
            name,
            out["claim_ms"]["p50"],
            out["tasks_per_s"]["median"],
            out["pg_cpu_ms_per_task"]["median"] or 0.0,
        )
        return out

    phases = {"empty": phase("empty queue")}
    started = time.monotonic()
    ids, _ = b.start_many(backlog_wid, plan.backlog_runs)
    create_s = time.monotonic() - started
    run_ids += ids
    ready = one(
        b.conn,
        "SELECT count(*) FROM awp.tasks t JOIN awp.runs r USING (run_id)"
        " WHERE r.workflow_id = %s AND r.status IN ('pending', 'running') AND t.status = 'ready'",
        [backlog_wid],
    )[0]
    log.info(
        "  backlog: %d runs x %d '%s' tasks started in one transaction in %.2f s (%d ready)",
        plan.backlog_runs,
        plan.backlog_tasks,
        IDLE_KIND,
        create_s,
        ready,
    )
    time.sleep(1.0)  # a coordinator pass or two with the backlog
    try:
        phases["backlog"] = phase("backlog")
    finally:
        cleanup = cancel_waiting(b, IDLE_KIND)
        b.wait_live(backlog_wid, timeout=120)
        log.info("  backlog canceled: %d runs in %d calls, %.2f s", cleanup["runs"], cleanup["calls"], cleanup["s"])
    phases["empty_after"] = phase("empty queue, after")

    empty_claims = phases["empty"]["claim_ms"]["values"] + phases["empty_after"]["claim_ms"]["values"]
    empty_cpu = (phases["empty"]["pg_cpu_ms_per_task"]["values"] or []) + (
        phases["empty_after"]["pg_cpu_ms_per_task"]["values"] or []
    )
    claim = {"empty": percentiles(empty_claims, (0.5,))["p50"], "backlog": phases["backlog"]["claim_ms"]["p50"]}
    cpu = {
        "empty": statistics.median(empty_cpu) if empty_cpu else None,
        "backlog": phases["backlog"]["pg_cpu_ms_per_task"]["median"],
    }
    return {
        "label": f"backlog: {plan.backlog_runs:,} runs x {plan.backlog_tasks} ready '{IDLE_KIND}' tasks, no worker of "
        f"that kind; {n} workers x 1 (mock)",
        "status": "measured",
        "idle_kind": IDLE_KIND,
        "backlog_runs": plan.backlog_runs,
        "backlog_tasks": plan.backlog_tasks,
        "ready_tasks": ready,
        "create_s": round(create_s, 2),
        "cleanup": cleanup,
        "workload_tasks": tasks,
        "samples": plan.backlog_samples,
        "phases": phases,
        "claim_p50_ms": claim,
        "claim_ratio": claim["backlog"] / claim["empty"] if claim["empty"] else None,
        "pg_cpu_ms_per_task": cpu,
        "cpu_ratio": cpu["backlog"] / cpu["empty"] if cpu["empty"] and cpu["backlog"] is not None else None,
        "invariants": b.invariants_of("backlog", run_ids),
    }


# ---- c. coordinator pass ----------------------------------------------------------------------------------


def timed_passes(b: Bench, sql: str, samples: int) -> dict[str, Any]:
    """``samples`` passes, each in its own transaction: ms of the statement + commit, and of the statement."""
    total, statement = [], []
    dispatched = 0
    for _ in range(samples):
        time.sleep(0.02)
        with b.conn.transaction():
            t0 = time.perf_counter()
            answer = one(b.conn, sql)[0]
            t1 = time.perf_counter()
        t2 = time.perf_counter()
        total.append((t2 - t0) * 1000)
        statement.append((t1 - t0) * 1000)
        dispatched += answer.get("dispatched", 0)
    return {
        "total_ms": percentiles(total, (0.5, 0.95)),
        "statement_ms": percentiles(statement, (0.5, 0.95)),
        "dispatched": dispatched,
    }


def pass_profile(b: Bench, sql: str, samples: int = 5, top: int = 4) -> list[dict[str, Any]] | None:
    """Where a pass's time goes: the self time of each ``awp`` function in ``samples`` more passes (track_functions,
    read in the pass's own transaction from pg_stat_xact_user_functions), median per function, the ``top`` ones;
    None when this session may not set track_functions (not a superuser)."""
    try:
        b.conn.execute("SET track_functions = 'all'")
    except psycopg.Error:
        return None
    by_function: dict[str, list[float]] = {}
    try:
        for _ in range(samples):
            with b.conn.transaction():
                b.conn.execute(sql)
                rows = b.conn.execute(
                    "SELECT funcname, self_time FROM pg_stat_xact_user_functions WHERE schemaname = 'awp'"
                ).fetchall()
            for name, self_ms in rows:
                by_function.setdefault(name, []).append(self_ms)
    finally:
        b.conn.execute("RESET track_functions")
    ranked = sorted(((statistics.median(v), k) for k, v in by_function.items()), reverse=True)[:top]
    return [{"function": k, "self_ms": round(v, 3)} for v, k in ranked]


def gateway_passes(before: dict[Any, float], after: dict[Any, float]) -> dict[str, Any]:
    """The gateway's own coordinator passes between two scrapes: count and mean ms (its /metrics histogram)."""
    name = "awp_coordinator_pass_duration_seconds"
    count = after.get((f"{name}_count", ()), 0.0) - before.get((f"{name}_count", ()), 0.0)
    total = after.get((f"{name}_sum", ()), 0.0) - before.get((f"{name}_sum", ()), 0.0)
    return {"passes": count, "mean_ms": total * 1000 / count if count else None}


def coordinator_pass(b: Bench, plan: Plan) -> dict[str, Any]:
    b.pool.resize(plan.many_workers, 1)  # idle, long-polling: free "mock" slots, no worker of IDLE_KIND
    wid = b.workflow(f"bench-pass-1-{IDLE_KIND}", 1, 1, {"executor": IDLE_KIND})
    few = max(5, plan.pass_samples // 5)
    live0 = one(b.conn, "SELECT count(*) FROM awp.runs WHERE status IN ('pending', 'running')")[0]
    empty = {"tick3": timed_passes(b, PASS_3, plan.pass_samples), "tick2": timed_passes(b, PASS_2, few)}
    started = time.monotonic()
    run_ids, _ = b.start_many(wid, plan.pass_runs)
    create_s = time.monotonic() - started
    live = one(b.conn, "SELECT count(*) FROM awp.runs WHERE status IN ('pending', 'running')")[0]
    log.info(
        "  coordinator pass: %d runs of 1 '%s' task started in %.2f s; %d live runs",
        plan.pass_runs,
        IDLE_KIND,
        create_s,
        live,
    )
    try:
        time.sleep(1.0)
        before = b.gateway.metrics()
        loaded: dict[str, Any] = {
            "tick3": timed_passes(b, PASS_3, plan.pass_samples),
            "tick2": timed_passes(b, PASS_2, few),
        }
        gw = gateway_passes(before, b.gateway.metrics())
        loaded["profile"] = pass_profile(b, PASS_3)
        b.pool.resize(0)  # no free slot of any kind: the other way to have nothing to dispatch
        no_slot: dict[str, Any] = {
            "tick3": timed_passes(b, PASS_3, plan.pass_samples),
            "tick2": timed_passes(b, PASS_2, few),
        }
        no_slot["profile"] = pass_profile(b, PASS_3)
    finally:
        cleanup = cancel_waiting(b, IDLE_KIND)
        b.wait_live(wid, timeout=120)
    log.info(
        '  coordinator pass with %d live runs, idle mock workers: p50 %.2f ms (statement %.2f ms), with "limited" '
        "%.2f ms; no worker: %.2f ms; no live run: %.2f ms; the gateway's passes meanwhile: %d, mean %s ms; "
        "canceled in %.1f s",
        live,
        loaded["tick3"]["total_ms"]["p50"],
        loaded["tick3"]["statement_ms"]["p50"],
        loaded["tick2"]["total_ms"]["p50"],
        no_slot["tick3"]["total_ms"]["p50"],
        empty["tick3"]["total_ms"]["p50"],
        gw["passes"],
        f"{gw['mean_ms']:.2f}" if gw["mean_ms"] is not None else "-",
        cleanup["s"],
    )
    return {
        "label": f"coordinator pass, {plan.pass_runs:,} live 1-task '{IDLE_KIND}' runs, nothing to dispatch",
        "status": "measured",
        "idle_kind": IDLE_KIND,
        "runs": plan.pass_runs,
        "live_runs": live,
        "live_runs_before": live0,
        "samples": plan.pass_samples,
        "create_s": round(create_s, 2),
        "cleanup": cleanup,
        "no_live_runs": empty,
        "loaded": loaded,  # the runs live, 4 idle mock workers (free slots, none of IDLE_KIND)
        "no_free_slot": no_slot,  # the runs live, no worker
        "gateway_passes": gw,
        "invariants": b.invariants_of("coordinator pass", run_ids),
    }


# ---- e. run starts through HTTP ---------------------------------------------------------------------------


async def post_runs(url: str, token: str, clients: int, seconds: float) -> dict[str, Any]:
    """``clients`` loops, each with one kept connection, POSTing run starts for ``seconds``."""
    latencies: list[float] = []
    statuses: Counter[int] = Counter()
    stop_at = time.perf_counter() + seconds
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}

    async def client() -> None:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as session:
            while time.perf_counter() < stop_at:
                started = time.perf_counter()
                async with session.post(url, data=b"{}", headers={**headers, "Idempotency-Key": uuid.uuid4().hex}) as r:
                    await r.read()
                    statuses[r.status] += 1
                latencies.append((time.perf_counter() - started) * 1000)

    began = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    elapsed = time.perf_counter() - began
    return {
        "clients": clients,
        "elapsed_s": elapsed,
        "requests": len(latencies),
        "started": statuses.get(202, 0),
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
        "runs_per_s": statuses.get(202, 0) / elapsed,
        "latency_ms": percentiles(latencies),
    }


def http_starts(b: Bench, plan: Plan) -> dict[str, Any]:
    b.pool.resize(0)  # starts only
    wid = b.workflow("bench-start-1", 1, 1)
    version = one(b.conn, "SELECT max(version) FROM awp.workflow_versions WHERE workflow_id = %s", [wid])[0]
    url = f"{b.gateway.base_url}/api/v1/workflows/{wid}/versions/{version}/runs"
    token = b.gateway.tokens["operator"]
    asyncio.run(post_runs(url, token, max(plan.start_clients), 1.0))  # warm-up: connections, pools, plans
    out = []
    for clients in plan.start_clients:
        time.sleep(0.3)
        since = one(b.conn, "SELECT clock_timestamp()")[0]
        cpu0, me0, gw0 = cpu_now(b), time.process_time(), b.gateway.metrics()
        r = asyncio.run(post_runs(url, token, clients, plan.start_seconds))
        cpu1, me1 = cpu_now(b), time.process_time()
        gw = procs.coordinator_work(gw0, b.gateway.metrics())
        made, first, last = one(
            b.conn,
            "SELECT count(*), min(created_at), max(created_at) FROM awp.runs"
            " WHERE workflow_id = %s AND created_at > %s",
            [wid, since],
        )
        cpu = {k: cpu1[k] - cpu0[k] for k in ("gateway", "postgres")}
        requests = max(1, r["requests"])
        r |= {
            "db_runs": made,
            "db_runs_per_s": made / (last - first).total_seconds() if made > 1 else None,
            "cpu_ms_per_request": {
                "gateway": cpu["gateway"] * 1000 / requests,
                "postgres": cpu["postgres"] * 1000 / requests if b.datadir else None,
                "client": (me1 - me0) * 1000 / requests,
            },
            "coordinator_passes": gw["passes"],
        }
        out.append(r)
        log.info(
            "  POST .../runs, %d client(s): %.0f runs/s (%d started, statuses %s; p50 %.1f ms, p99 %.1f ms); "
            "CPU ms/request: gateway %.2f, PostgreSQL %s, this client %.2f",
            clients,
            r["runs_per_s"],
            r["started"],
            r["statuses"],
            r["latency_ms"]["p50"],
            r["latency_ms"]["p99"],
            r["cpu_ms_per_request"]["gateway"],
            f"{r['cpu_ms_per_request']['postgres']:.2f}" if b.datadir else "-",
            r["cpu_ms_per_request"]["client"],
        )
    total = one(b.conn, "SELECT count(*) FROM awp.runs WHERE workflow_id = %s", [wid])[0]
    cleanup = cancel_waiting(b, "mock")  # nothing else waits: the scenarios before ended with every run finished
    b.wait_live(wid, timeout=120)
    run_ids = [r[0] for r in b.conn.execute("SELECT run_id FROM awp.runs WHERE workflow_id = %s", [wid]).fetchall()]
    log.info("  the %d runs started through HTTP: canceled in %d calls, %.1f s", total, cleanup["calls"], cleanup["s"])
    return {
        "label": f"run starts: POST .../runs of a 1-task workflow, {'/'.join(map(str, plan.start_clients))} clients, "
        f"{plan.start_seconds:g} s each, no worker",
        "status": "measured",
        "seconds": plan.start_seconds,
        "clients": out,
        "runs_total": total,
        "cleanup": cleanup,
        "invariants": b.invariants_of("run starts through HTTP", run_ids),
    }
