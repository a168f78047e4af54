"""benchmarks/report.py's targets and tables of issue 46 (benchmarks/many_runs.py, step 9 of ``make bench``), from
synthetic results: each threshold at its edge, a scenario that failed or did not run (never a pass), the ratios'
bases, and the text of ``run.py --many-runs-only``."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from bench_support import RUN, report


def spread(*values: float) -> dict[str, Any]:
    ordered = sorted(values)
    return {
        "median": ordered[len(ordered) // 2],
        "min": ordered[0],
        "max": ordered[-1],
        "n": len(values),
        "values": list(values),
    }


def pcts(p50: float, p95: float | None = None) -> dict[str, Any]:
    return {"n": 10, "p50": p50, "p95": p95 if p95 is not None else p50, "p99": p95 if p95 is not None else p50}


NO_VIOLATION = {"violations": 0, "by_invariant": {}, "sample": [], "runs_checked": 10, "check_s": 0.1}


def shape(runs: int, tasks: int, rate: float) -> dict[str, Any]:
    name = f"{runs:,} run{'s' if runs > 1 else ''} x {tasks:,} task{'s' if tasks > 1 else ''}"
    return {
        "label": f"{name}, 4 workers x 1",
        "shape": name,
        "base": runs == 1,
        "runs": runs,
        "tasks_per_run": tasks,
        "workers": 4,
        "tasks_per_s": spread(rate),
        "latency_ms": {"claim": pcts(400.0, 900.0)},
        "cpu_ms_per_task": {"gateway": spread(0.4), "workers": spread(0.4), "postgres": spread(0.6)},
        "gateway_cpu_ms_per_request": spread(0.4),
        "repetitions": [{"requests": runs * tasks, "tasks": runs * tasks}],
        "start_s": spread(0.5),
        "start_pg_cpu_s": spread(0.4),
        "last_start_s": spread(2.0),
    }


def passes(p50: float) -> dict[str, Any]:
    return {"total_ms": pcts(p50, p50 * 1.2), "statement_ms": pcts(p50 - 1), "dispatched": 0}


def many(
    base: float = 500.0,
    m10: float = 400.0,
    m1: float = 300.0,
    claims: tuple[float, float] = (5.0, 6.0),
    cpu: tuple[float, float] = (1.0, 1.2),
    pass_ms: float = 19.9,
    starts: float = 300.0,
    logs: tuple[float, float] = (450.0, 500.0),
) -> dict[str, Any]:
    def phase(claim: float, cpu_ms: float) -> dict[str, Any]:
        return {
            "claim_ms": pcts(claim) | {"values": [claim] * 10},
            "dispatch_ms": pcts(1.0),
            "tasks_per_s": spread(500.0),
            "pg_cpu_ms_per_task": spread(cpu_ms),
            "gateway_cpu_ms_per_task": spread(0.4),
        }

    def level(rate: float) -> dict[str, Any]:
        return {
            "tasks_per_s": spread(rate),
            "cpu_ms_per_task": {k: spread(0.4) for k in ("gateway", "workers", "postgres")},
            "log_bytes_per_task": {"gateway": 300.0, "workers": 200.0},
        }

    def clients(n: int, rate: float) -> dict[str, Any]:
        return {
            "clients": n,
            "elapsed_s": 5.0,
            "requests": int(rate * 5),
            "started": int(rate * 5),
            "statuses": {"202": int(rate * 5)},
            "runs_per_s": rate,
            "db_runs_per_s": rate,
            "latency_ms": pcts(10.0, 20.0),
            "cpu_ms_per_request": {"gateway": 0.5, "postgres": 1.5, "client": 0.3},
        }

    return {
        "throughput": {
            "label": "many runs: 1 run x 1,000 tasks; 1,000 runs x 10 tasks; 10,000 runs x 1 task; 4 workers x 1",
            "status": "measured",
            "workers": 4,
            "shapes": [shape(1, 1000, base), shape(1000, 10, m10), shape(10000, 1, m1)],
            "invariants": NO_VIOLATION,
        },
        "backlog": {
            "label": "backlog",
            "status": "measured",
            "idle_kind": "python",
            "backlog_runs": 1000,
            "backlog_tasks": 100,
            "ready_tasks": 100_000,
            "create_s": 2.0,
            "cleanup": {"runs": 1000, "calls": 2, "s": 2.5},
            "workload_tasks": 1000,
            "samples": 10,
            "phases": {
                "empty": phase(claims[0], cpu[0]),
                "backlog": phase(claims[1], cpu[1]),
                "empty_after": phase(claims[0], cpu[0]),
            },
            "claim_p50_ms": {"empty": claims[0], "backlog": claims[1]},
            "claim_ratio": claims[1] / claims[0],
            "pg_cpu_ms_per_task": {"empty": cpu[0], "backlog": cpu[1]},
            "cpu_ratio": cpu[1] / cpu[0],
            "invariants": NO_VIOLATION,
        },
        "coordinator_pass": {
            "label": "coordinator pass",
            "status": "measured",
            "idle_kind": "python",
            "runs": 10000,
            "live_runs": 10000,
            "live_runs_before": 0,
            "samples": 10,
            "create_s": 10.0,
            "cleanup": {"runs": 10000, "calls": 11, "s": 30.0},
            "no_live_runs": {"tick3": passes(3.0), "tick2": passes(4.0)},
            "loaded": {
                "tick3": passes(pass_ms),
                "tick2": passes(50.0),
                "profile": [{"function": "_create_dispatches", "self_ms": 6.2}],
            },
            "no_free_slot": {"tick3": passes(2.0), "tick2": passes(40.0), "profile": None},
            "gateway_passes": {"passes": 3.0, "mean_ms": 30.0},
            "invariants": NO_VIOLATION,
        },
        "logging": {
            "label": "logging",
            "status": "measured",
            "order": ["info", "warning", "warning", "info"],
            "levels": {"info": level(logs[0]), "warning": level(logs[1])},
            "ratio": logs[0] / logs[1],
            "pair_ratios": [logs[0] / logs[1]] * 2,
            "invariants": NO_VIOLATION,
        },
        "starts": {
            "label": "run starts",
            "status": "measured",
            "seconds": 5.0,
            "clients": [clients(8, starts), clients(1, starts / 2)],
            "runs_total": int(starts * 7.5),
            "cleanup": {"runs": int(starts * 7.5), "calls": 3, "s": 3.0},
            "invariants": NO_VIOLATION,
        },
    }


def alone(many_runs: dict[str, Any]) -> dict[str, Any]:
    """The results of ``run.py --many-runs-only``: no step 2, no peer."""
    return {
        "plan": {"name": "full", "single_tasks": 1000},
        "machine": {"cpus": 2},
        "postgres": {"server_version": "15", "fsync": "on", "shared_buffers": "128MB"},
        "started_at": "2026-12-05T10:00:00+00:00",
        "elapsed_s": 300.0,
        "many_runs": many_runs,
    }


def test_each_issue_46_threshold_at_its_edge() -> None:
    rows = report().many_runs_targets(alone(many()))
    met = {name: ok for name, _, ok in rows}
    names = list(met)
    assert met[next(n for n in names if n.startswith("(46) 1,000 runs x 10 tasks"))] is True  # 400 = 0.8 x 500
    assert met[next(n for n in names if n.startswith("(46) 10,000 runs x 1 task"))] is True  # 300 = 0.6 x 500
    assert met[next(n for n in names if "idle claim p50" in n)] is True  # 6.0 = 1.2 x 5.0
    assert met[next(n for n in names if "backlog" in n and "PostgreSQL CPU" in n)] is True  # 1.2 = 1.2 x 1.0
    assert met[next(n for n in names if n.startswith("(46) coordinator pass"))] is True  # 19.9 < 20
    assert met[next(n for n in names if n.startswith("(46) POST"))] is True  # 300 runs/s
    assert met[next(n for n in names if "(INFO)" in n)] is True  # 450 = 0.9 x 500
    assert met[next(n for n in names if n.startswith("(46) PostgreSQL CPU per task <= 0.7"))] is True  # base: 0.6
    assert met[next(n for n in names if "procrastinate" in n)] is None  # no peer in --many-runs-only
    assert met[next(n for n in names if "check_invariants" in n)] is True

    worse = many(
        m10=399.0, m1=299.0, claims=(5.0, 6.1), cpu=(1.0, 1.21), pass_ms=20.0, starts=299.0, logs=(449.0, 500.0)
    )
    rows = report().many_runs_targets(alone(worse))
    assert [ok for name, _, ok in rows if "procrastinate" not in name and "PostgreSQL CPU per task <= 0.7" not in name][
        :-1
    ] == [False] * 7


def test_ratios_use_the_alternating_base_and_name_step_2s() -> None:
    rows = report().many_runs_targets(alone(many(base=500.0, m10=450.0)))
    name, measured, _ = next(r for r in rows if r[0].startswith("(46) 1,000 runs x 10 tasks"))
    assert "of 1 run x 1,000 tasks (repetitions alternating)" in name
    assert measured == "450 vs 500 tasks/s = 0.90 x"  # no step 2 in this run: no second ratio

    full = json.loads(RUN.read_text())  # a full run's step 2: 1 run x 1000 tasks, 4 workers, beside the peer
    step2 = next(t for t in full["throughput"] if t["label"] == "1 run x 1000 tasks, 4 workers")["tasks_per_s"][
        "median"
    ]
    full["many_runs"] = many(base=500.0, m10=450.0)
    rows = report().targets(full)
    measured = next(m for n, m, _ in rows if n.startswith("(46) 1,000 runs x 10 tasks"))
    assert measured == f"450 vs 500 tasks/s = 0.90 x; x step 2's 1 run x 1000 tasks: {450 / step2:.2f}"
    peer = full["peer"]["tasks_per_s"]["median"]
    name, measured, met = next(r for r in rows if "1.5 x procrastinate" in r[0])
    assert (measured, met) == (f"{step2 / peer:.2f} x ({step2:,.0f} vs {peer:,.0f} tasks/s)", step2 / peer >= 1.5)
    # the issue-11 target stays beside it
    assert any(n.startswith("(1) 1 run x 1000 tasks, 4 workers >= 1.0 x procrastinate") for n, _, _ in rows)
    name, measured, met = next(r for r in rows if r[0].startswith("(46) PostgreSQL CPU per task <= 0.7"))
    assert "step 2" in name and met is False  # step 2's own figure (2.55 ms in that run), not the base's 0.6


def test_a_failed_or_missing_scenario_is_never_a_pass() -> None:
    m = many()
    m["backlog"] = {"label": "backlog", "status": "failed", "error": "TimeoutError: slow"}
    del m["starts"]
    rows = report().many_runs_targets(alone(m))
    backlog = [r for r in rows if "backlog" in r[0]]
    assert [(measured, met) for _, measured, met in backlog] == [("FAILED: TimeoutError: slow", None)] * 2
    assert next(r for r in rows if r[0].startswith("(46) POST"))[1:] == ("not measured", None)
    text = report().many_runs_text(alone(m))
    assert "Issue 46 scenarios that FAILED" in text and "TimeoutError: slow" in text

    old = json.loads(RUN.read_text())  # written before step 9: every issue-46 row NOT MEASURED, none a pass
    rows = [r for r in report().targets(old) if r[0].startswith("(46)")]
    measured_here = [r for r in rows if "procrastinate" not in r[0] and "PostgreSQL CPU per task <= 0.7" not in r[0]]
    assert len(measured_here) == 7 and all(met is None for _, _, met in measured_here)


def test_the_invariants_target_counts_issue_46_scenarios() -> None:
    full = json.loads(RUN.read_text())
    before = next(m for n, m, _ in report().targets(full) if "check_invariants" in n)
    assert before == "10 of 10 scenarios empty"
    full["many_runs"] = many()
    full["many_runs"]["logging"] = copy.deepcopy(full["many_runs"]["logging"])
    full["many_runs"]["logging"]["invariants"] = NO_VIOLATION | {
        "violations": 2,
        "by_invariant": {"run_concurrency": 2},
    }
    _, measured, met = next(r for r in report().targets(full) if "check_invariants" in r[0])
    assert met is False and measured == "1 of 15 scenarios with violations (logging: 2)"


@pytest.mark.parametrize("quick", [False, True])
def test_many_runs_only_text_has_every_table(quick: bool) -> None:
    results = alone(many())
    if quick:
        results["plan"]["name"] = "quick"
    text = report().many_runs_text(results)
    for title in (
        "Many runs (issue 46)",
        "Backlog (issue 46)",
        "Coordinator pass (issue 46)",
        "Logging (issue 46)",
        "Run starts through HTTP (issue 46)",
        "awp.check_invariants() at the end of each scenario",
        "Targets of issue 46",
    ):
        assert title in text
    assert "Where a (false, NULL, false) pass's time goes with 10,000 live runs, 4 idle mock workers" in text
    assert ("Quick run:" in text) is quick
    assert "300/200" in text  # the log bytes per task of each level, gateway/workers
    assert "MISS" not in text.split("Targets of issue 46")[1]
