"""Issue 46 in ``make bench``: many runs at once (step 9 of ``run.py``, after retention; ``run.py --many-runs-only``
runs these alone, ``--quick`` at reduced sizes). Same cluster, same ``awp serve``, real ``awp worker`` processes
(``many_workers`` = 4, ``--concurrency 1``, executor ``mock``, ``sleep_ms`` 0), in order:

a. many runs: N runs x M tasks (1,000 x 10, run concurrency 4; 10,000 x 1), all started in one transaction
   (``awp.start_runs``, 1,000 a call), timed from its commit (database clock) to the last run's end. Their rounds
   alternate with one run of ``many_base_tasks`` (1,000) started and timed the same way (base, 1,000 x 10, 10,000 x
   1, then backwards, ...): that run's median is the base of the targets (>= 0.8 x and >= 0.6 x), measured in the
   same minutes (this machine drifts by 20% within minutes); the report also gives the ratio to step 2's median.
   CPU is counted from the commit (the start transaction's own time and PostgreSQL CPU are given apart).
b. backlog: ``backlog_runs`` x ``backlog_tasks`` (1,000 x 100 = 100,000) ready tasks of executor ``python``, which
   no worker serves, started in one transaction; the same small workload measured before it exists, while it
   exists, and after it is canceled (``awp.cancel_waiting_runs('python', 1000)`` until it returns 0): idle claims
   (1-task runs one at a time: submit -> claimed, as step 5) and one run of ``many_base_tasks`` (tasks/s, PostgreSQL
   CPU per task, dispatch -> claim per task). The empty-queue figures pool the before and after phases.
c. coordinator pass: ``pass_runs`` (10,000) live 1-task runs of executor ``python`` (nothing to dispatch: the 4
   idle ``mock`` workers have free slots, no worker serves ``python``); ``SELECT awp.coordinator_tick(false, NULL,
   false)`` (the gateway's pass between its limits reports) ``pass_samples`` times from this harness, each in its
   own transaction: p50 of the statement + its commit (the target) and of the statement alone; the 2-argument form
   (which also computes "limited") a fifth as often; the same with the workers stopped (no free slot of any kind),
   and with no live run, for reference; and the gateway's own passes meanwhile (its /metrics histogram).
d. logging: one run of ``many_base_tasks`` on the 4 workers, ``log_pairs`` pairs of repetitions alternating
   (INFO, WARNING, WARNING, INFO, ...): INFO is the default of ``awp serve`` and ``awp worker``; WARNING is
   ``awp worker --log-level warning`` and, as ``awp serve`` has no such option, the gateway started through a
   wrapper that sets its ``awp`` loggers to WARNING (``procs._SERVE_AT_LEVEL``). The gateway and the workers are
   restarted before every repetition (both levels alike), then an untimed warm-up run.
e. run starts through HTTP: ``start_clients`` (8, then 1) concurrent clients (asyncio + aiohttp in this process,
   one kept connection each) POST ``/api/v1/workflows/{id}/versions/1/runs`` (operator token, a new
   Idempotency-Key per request, body ``{}``) of a 1-task workflow for ``start_seconds`` each, workers stopped
   (starts only); runs/s of 202 answers. Then every run so started is canceled (``awp.cancel_waiting_runs``).

Each scenario ends with ``awp.check_invariants()`` over its own runs (``Bench.invariants_of``: 1,000 runs a call;
a whole-database call costs runs x tasks here); a failed scenario is recorded (``status: failed``) and the others
still run.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import statistics
import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import aiohttp
import procs
import psycopg
from figures import median_spread, percentiles, summarize

from awp_testing.cluster import one

if TYPE_CHECKING:
    from run import Bench, Plan

log = logging.getLogger("bench")

IDLE_KIND = "python"  # the backlog's and the coordinator pass's executor kind: the bench's workers run "mock" only
WARM_UP_TASKS = 200
PASS_3 = "SELECT awp.coordinator_tick(false, NULL, false)"
PASS_2 = "SELECT awp.coordinator_tick()"


def shape_name(runs: int, tasks: int) -> str:
    return f"{runs:,} run{'s' if runs > 1 else ''} x {tasks:,} task{'s' if tasks > 1 else ''}"


def shape_label(runs: int, tasks: int, workers: int) -> str:
    return f"{shape_name(runs, tasks)}, {workers} workers x 1"


def cpu_now(b: Bench) -> dict[str, float]:
    return {
        "gateway": procs.cpu_seconds([b.gateway.pid]),
        "workers": procs.cpu_seconds(b.pool.pids()),
        "postgres": procs.cpu_seconds(b.postgres_pids(), include_reaped_children=True),
    }


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


# ---- a. many runs -----------------------------------------------------------------------------------------


def many_repetition(b: Bench, label: str, wid: str, runs: int, tasks: int, which: str) -> dict[str, Any]:
    """``runs`` runs of ``wid`` started in one transaction, on the workers running now; timed from the commit."""
    total = runs * tasks
    time.sleep(0.3)  # the previous repetition's tail settles
    before = b.snapshot()
    t0 = time.monotonic()
    run_ids, committed = b.start_many(wid, runs)
    start_s = time.monotonic() - t0
    at_commit = cpu_now(b)
    b.wait_live(wid, timeout=max(120.0, total / 10), poll=0.05 if runs == 1 else 0.5)
    m = b.measured(before, total)
    bad, last_start_s, median_start_s, last_end = one(
        b.conn,
        "SELECT count(*) FILTER (WHERE status <> 'succeeded'), extract(epoch FROM max(started_at) - %(c)s),"
        " percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM started_at - %(c)s)), max(finished_at)"
        " FROM awp.runs WHERE run_id = ANY(%(ids)s)",
        {"c": committed, "ids": run_ids},
    )
    if bad:
        raise RuntimeError(f"{label}: {bad} of {runs} runs did not succeed")
    # CPU from the commit: the start transaction's own is given apart (start_cpu_s)
    m["start_cpu_s"] = {k: at_commit[k] - before[f"cpu_{k}"] for k in at_commit}
    for k, v in m["start_cpu_s"].items():
        if m["cpu_s"][k] is not None:
            m["cpu_s"][k] -= v
    span = (last_end - committed).total_seconds()
    m |= {
        "span_s": span,
        "tasks_per_s": total / span if span > 0 else 0.0,
        "start_s": start_s,  # the one transaction that started the runs, to its commit
        "submit_to_start_ms": float(median_start_s) * 1000,  # the commit -> the median run's first dispatch
        "last_start_s": float(last_start_s),  # the commit -> the last run's first dispatch
        "run_ids": run_ids,
    }
    log.info(
        "  %s, repetition %s: %.0f tasks/s (%d tasks in %.2f s from the commit; started in %.2f s, one transaction)",
        label,
        which,
        m["tasks_per_s"],
        total,
        span,
        start_s,
    )
    return m


def throughput(b: Bench, plan: Plan) -> dict[str, Any]:
    n, base_tasks = plan.many_workers, plan.many_base_tasks
    shapes = [
        (shape_label(1, base_tasks, n), b.workflow(f"bench-single-{base_tasks}-c{n}", base_tasks, n), 1, base_tasks)
    ]
    for runs, tasks in plan.many_shapes:
        conc = min(n, tasks)
        shapes.append(
            (shape_label(runs, tasks, n), b.workflow(f"bench-many-{tasks}-c{conc}", tasks, conc), runs, tasks)
        )
    b.pool.resize(n, 1)
    warm = b.workflow(f"bench-warm-up-c{n}", WARM_UP_TASKS, n)
    run_ids: list[str] = b.repetition("warm-up (not measured)", warm, 1, WARM_UP_TASKS, "1/1")["run_ids"]
    reps: dict[str, list[dict[str, Any]]] = {label: [] for label, *_ in shapes}
    for i in range(plan.many_repeats):
        for label, wid, runs, tasks in shapes if i % 2 == 0 else shapes[::-1]:
            r = many_repetition(b, label, wid, runs, tasks, f"{i + 1}/{plan.many_repeats}")
            run_ids += r.pop("run_ids")
            reps[label].append(r)
    summaries = []
    for label, _, runs, tasks in shapes:
        rs = reps[label]
        summaries.append(
            summarize(label, rs, runs, tasks)
            | {
                "shape": shape_name(runs, tasks),
                "workers": n,
                "base": runs == 1,
                "start_s": median_spread([r["start_s"] for r in rs]),
                "start_pg_cpu_s": median_spread([r["start_cpu_s"]["postgres"] for r in rs]),
                "last_start_s": median_spread([r["last_start_s"] for r in rs]),
            }
        )
    return {
        "label": f"many runs: {'; '.join(s['shape'] for s in summaries)}; {n} workers x 1",
        "status": "measured",
        "workers": n,
        "shapes": summaries,
        "invariants": b.invariants_of("many runs", run_ids),
    }


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


# ---- d. logging -------------------------------------------------------------------------------------------


def restart(b: Bench, level: str | None) -> None:
    """The gateway and no worker, at ``level`` (None: as in the other scenarios, the gateway at its default and the
    workers, once started, at warning)."""
    b.pool.resize(0)
    b.gateway.stop()
    b.gateway.log_level = level
    b.pool.log_level = level or "warning"
    b.gateway.start()


def log_bytes(b: Bench) -> dict[str, int]:
    """The sizes of the gateway's log and of the running workers' logs (all of them appended to)."""
    workers = 0
    for w in b.pool.workers:
        with contextlib.suppress(OSError):
            workers += (b.workdir / f"{w.name}.log").stat().st_size
    return {"gateway": b.gateway.log_offset(), "workers": workers}


def logging_cost(b: Bench, plan: Plan) -> dict[str, Any]:
    n, tasks = plan.many_workers, plan.many_base_tasks
    wid = b.workflow(f"bench-single-{tasks}-c{n}", tasks, n)
    warm = b.workflow(f"bench-warm-up-c{n}", WARM_UP_TASKS, n)
    order: list[str] = []
    for i in range(plan.log_pairs):
        order += ["info", "warning"] if i % 2 == 0 else ["warning", "info"]
    reps: dict[str, list[dict[str, Any]]] = {"info": [], "warning": []}
    run_ids: list[str] = []
    try:
        for j, level in enumerate(order):
            restart(b, level)
            b.pool.resize(n, 1)
            run_ids += b.repetition("warm-up (not measured)", warm, 1, WARM_UP_TASKS, "1/1")["run_ids"]
            logged = log_bytes(b)
            m = b.repetition(
                f"logs at {level.upper()}, 1 run x {tasks:,}", wid, 1, tasks, f"{j // 2 + 1}/{plan.log_pairs}"
            )
            m["log_bytes_per_task"] = {k: (v - logged[k]) / tasks for k, v in log_bytes(b).items()}
            run_ids += m.pop("run_ids")
            reps[level].append(m)
    finally:
        restart(b, None)
    levels = {
        level: summarize(f"1 run x {tasks:,} tasks, {n} workers x 1, logs at {level.upper()}", rs, 1, tasks)
        for level, rs in reps.items()
    }
    for level, rs in reps.items():  # what each level wrote: shows that it took effect
        levels[level]["log_bytes_per_task"] = {
            k: statistics.median(r["log_bytes_per_task"][k] for r in rs) for k in ("gateway", "workers")
        }
    info, warning = (levels[k]["tasks_per_s"]["median"] for k in ("info", "warning"))
    return {
        "label": f"logging: 1 run x {tasks:,} tasks, {n} workers x 1, INFO vs WARNING alternating",
        "status": "measured",
        "order": order,
        "levels": levels,
        "ratio": info / warning if info is not None and warning else None,
        "pair_ratios": [
            i["tasks_per_s"] / w["tasks_per_s"] for i, w in zip(reps["info"], reps["warning"], strict=False)
        ],
        "invariants": b.invariants_of("logging", run_ids),
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


# ---- all of them ------------------------------------------------------------------------------------------

SCENARIOS: tuple[tuple[str, Callable[[Bench, Plan], dict[str, Any]]], ...] = (
    ("throughput", throughput),
    ("backlog", backlog),
    ("coordinator_pass", coordinator_pass),
    ("logging", logging_cost),
    ("starts", http_starts),
)


def recover(b: Bench) -> None:
    """After a failed scenario: no worker, the gateway restarted at its defaults, every live run canceled."""
    with_errors: list[str] = []
    for step in (
        lambda: restart(b, None),
        lambda: b.conn.execute(
            "SELECT count(awp.request_cancel(run_id)) FROM awp.runs WHERE status IN ('pending', 'running')"
        ),
    ):
        try:
            step()
        except Exception as exc:
            with_errors.append(f"{type(exc).__name__}: {exc}")
    if with_errors:
        log.error("  recovery after a failed scenario: %s", "; ".join(with_errors))


def measure(b: Bench, plan: Plan) -> dict[str, Any]:
    """Every scenario of issue 46, in order; one that fails is recorded as failed and the next still runs."""
    out: dict[str, Any] = {}
    for key, scenario in SCENARIOS:
        started = time.monotonic()
        log.info("issue 46, %s", key.replace("_", " "))
        try:
            out[key] = scenario(b, plan)
        except Exception as exc:
            log.exception("issue 46, %s: FAILED", key)
            out[key] = {"label": key.replace("_", " "), "status": "failed", "error": f"{type(exc).__name__}: {exc}"}
            recover(b)
        out[key]["elapsed_s"] = round(time.monotonic() - started, 1)
    return out
