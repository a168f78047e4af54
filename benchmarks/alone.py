"""``run.py --io-only``, ``--many-runs-only``, ``--dynamic-only``, ``--pacing-only`` and ``--progress-only``: one
step alone, on its own gateway and workers; it prints its table (and targets) and writes
``<step>-<plan>-<time>.json`` (``latest.*`` are left as they are)."""

from __future__ import annotations

import datetime as dt
import json
import logging
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import dynamic
import many_runs
import pacing
import progress_cost
import report
import report_steps
import report_targets
import scenarios
from harness import Bench, machine, postgres_settings
from plans import Plan
from procs import Reaper

log = logging.getLogger("bench")


def run_io_only(
    plan: Plan, dsn: str, datadir: Path | None, workdir: Path, reaper: Reaper, out: Path, when: dt.datetime
) -> int:
    """``--io-only``: the I/O-bound scenario alone, on its own gateway and workers; prints the table and writes
    ``io-<time>.json`` (``latest.*`` are left as they are)."""
    b = Bench(dsn, datadir, workdir, reaper)
    b.gateway.start()
    try:
        io = scenarios.io_bound(b, plan)
    finally:
        b.pool.resize(0)
        b.gateway.stop()
        b.conn.close()
    print(report_steps.io_table(io).text())
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"io-{when.strftime('%Y%m%dT%H%M%SZ')}.json"
    path.write_text(json.dumps(io, indent=2, default=str))
    log.info("written %s", path)
    return 1 if io["invariants"]["violations"] else 0


def run_many_only(
    plan: Plan, dsn: str, datadir: Path | None, workdir: Path, reaper: Reaper, out: Path, when: dt.datetime
) -> int:
    """``--many-runs-only``: the scenarios of issue 46 alone (``many_runs.py``), on their own gateway and workers;
    prints their tables and targets and writes ``many-<plan>-<time>.json`` (``latest.*`` are left as they are)."""
    started = time.monotonic()
    results = measure_alone(plan, dsn, datadir, workdir, reaper, "many_runs", many_runs.measure, when, postgres=True)
    results["elapsed_s"] = time.monotonic() - started
    results["problems"] = report_targets.problems(results)
    results["targets"] = [
        {"target": a, "measured": m, "met": c} for a, m, c in report_targets.many_runs_targets(results)
    ]
    print()
    print(report.many_runs_text(results))
    return write_alone(out, "many", plan, when, results)


def write_alone(out: Path, name: str, plan: Plan, when: dt.datetime, results: dict[str, Any]) -> int:
    """Write the results of a step run alone to ``<name>-<plan>-<time>.json`` in ``out``, log its problems; the
    exit code (1 when there are problems)."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}-{plan.name}-{when.strftime('%Y%m%dT%H%M%SZ')}.json"
    path.write_text(json.dumps(results, indent=2, default=str) + "\n")
    log.info("written %s", path)
    problems = results.get("problems", [])
    for p in problems:
        log.error("PROBLEM: %s", p)
    return 1 if problems else 0


def measure_alone(
    plan: Plan,
    dsn: str,
    datadir: Path | None,
    workdir: Path,
    reaper: Reaper,
    key: str,
    measure: Callable[[Bench, Plan], dict[str, Any]],
    when: dt.datetime,
    postgres: bool = False,
) -> dict[str, Any]:
    """One step alone (``--many-runs-only``, ``--dynamic-only``, ``--pacing-only``, ``--progress-only``) on its own
    gateway and workers: {"plan", "machine", "started_at"[, "postgres": its settings], key: what ``measure``
    returned}."""
    b = Bench(dsn, datadir, workdir, reaper)
    results: dict[str, Any] = {
        "plan": asdict(plan),
        "machine": machine(),
        "started_at": when.isoformat(timespec="seconds"),
    }
    if postgres:
        results["postgres"] = postgres_settings(b.conn)
    b.gateway.start()
    log.info("awp serve on %s; workers: real `awp worker` processes", b.gateway.base_url)
    try:
        results[key] = measure(b, plan)
    finally:
        b.pool.resize(0)
        b.gateway.stop()
        b.conn.close()
    return results


def run_step_only(
    step: str, plan: Plan, dsn: str, datadir: Path | None, workdir: Path, reaper: Reaper, out: Path, when: dt.datetime
) -> int:
    """``--dynamic-only`` (step 10, ``dynamic.py``) or ``--pacing-only`` (step 11, ``pacing.py``): that step alone
    (``measure_alone``); prints its table and targets and writes ``<step>-<plan>-<time>.json`` (``latest.*`` are
    left as they are)."""
    module, table, targets = {
        "dynamic": (dynamic, report_steps.dynamic_table, report_targets.dynamic_targets),
        "pacing": (pacing, report_steps.pacing_table, report_targets.pacing_targets),
    }[step]
    results = measure_alone(plan, dsn, datadir, workdir, reaper, step, module.measure, when)
    results["problems"] = report_targets.problems(results)
    print(table(results).text())
    for name, measured, met in targets(results):
        print(f"{name}: {measured} {'NOT MEASURED' if met is None else ('PASS' if met else 'MISS')}")
    return write_alone(out, step, plan, when, results)


def run_progress_only(
    plan: Plan, dsn: str, datadir: Path | None, workdir: Path, reaper: Reaper, out: Path, when: dt.datetime
) -> int:
    """``--progress-only``: step 12 alone (``progress_cost.py``), on its own gateway and workers; prints its table and
    writes ``progress-<plan>-<time>.json`` (``latest.*`` are left as they are)."""
    results = measure_alone(plan, dsn, datadir, workdir, reaper, "progress", progress_cost.measure, when)
    print(progress_cost.table(results["progress"]))
    write_alone(out, "progress", plan, when, results)
    return 0
