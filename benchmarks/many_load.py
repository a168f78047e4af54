"""Issue 46 in ``make bench`` (``many_runs.py``, whose docstring says how each is measured), the scenarios whose
runs the workers work through: a. many runs started in one transaction (``many_repetition``, also used by
``ab.py``) and d. logging at INFO against WARNING; and the shapes' names and the CPU readings they share."""

from __future__ import annotations

import contextlib
import logging
import statistics
import time
from typing import TYPE_CHECKING, Any

import procs
from figures import median_spread, summarize

from awp_testing.cluster import one

if TYPE_CHECKING:
    from harness import Bench
    from plans import Plan

log = logging.getLogger("bench")

WARM_UP_TASKS = 200


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
