"""benchmarks/report.py's "cores busy" column of the side-by-side table (AWP vs procrastinate): the CPU of every
measured process over each repetition's window x the machine's cores, median (min-max). Rendered from a committed
full run (benchmarks/results/bench-full-20261202T162243Z.json) and recomputed here from its repetitions. And
target (2)'s comparison: 16 workers against the 4-worker repetitions that alternated with theirs."""

from __future__ import annotations

import json
import statistics
from typing import Any

from bench_support import RUN, report


def expected(reps: list[dict[str, Any]], cpus: int) -> str:
    shares = sorted(sum(r["cpu_s"].values()) / (r["span_s"] * cpus) for r in reps)
    return f"{statistics.median(shares):.0%} ({shares[0]:.0%}-{shares[-1]:.0%})"


def test_side_by_side_shows_how_busy_the_cores_were() -> None:
    results = json.loads(RUN.read_text())
    cpus = results["machine"]["cpus"]
    awp = next(t for t in results["throughput"] if t["label"] == "1 run x 1000 tasks, 4 workers")
    lines = report().side_by_side(results).markdown().splitlines()
    header = [c.strip() for c in lines[2].strip("|").split("|")]
    rows = {c[0]: c for c in ([x.strip() for x in line.strip("|").split("|")] for line in lines[4:7])}
    busy = header.index("cores busy")
    awp_row = next(r for name, r in rows.items() if name.startswith("AWP: "))
    peer_row = next(r for name, r in rows.items() if name.startswith("procrastinate "))
    ref_row = next(r for name, r in rows.items() if name.startswith("plain SQL"))
    assert awp_row[busy] == expected(awp["repetitions"], cpus) == "70% (68%-75%)"
    assert peer_row[busy] == expected(results["peer"]["repetitions"], cpus) == "84% (82%-86%)"
    assert ref_row[busy] == "-"  # the reference's CPU is not measured


def test_cores_busy_is_unknown_without_every_process_kind() -> None:
    busy = report()._busy
    reps = [{"span_s": 2.0, "cpu_s": {"postgres": 1.0, "workers": 1.0}}]
    assert busy(reps, 2) == "50%"  # one repetition: no spread
    assert busy([{**reps[0], "cpu_s": {"postgres": None, "workers": 1.0}}], 2) == "-"
    assert busy(reps, None) == "-" and busy([], 2) == "-"


def test_target_2_compares_16_workers_with_the_4_worker_repetitions_alternating_with_them() -> None:
    results = json.loads(RUN.read_text())  # written before the alternation: the 4-worker scenario's figure
    name = "(2) 1 run x 1000 tasks: 16 workers not slower than 4 (median within 5%)"
    targets = {t[0]: t[1:] for t in report().targets(results)}
    s4 = next(t for t in results["throughput"] if t["label"] == "1 run x 1000 tasks, 4 workers")
    s16 = next(t for t in results["throughput"] if t["label"] == "1 run x 1000 tasks, 16 workers")
    a, b = s4["tasks_per_s"]["median"], s16["tasks_per_s"]["median"]
    assert targets[name] == (f"{b:,.0f} vs {a:,.0f} tasks/s ({b / a:.2f} x)", b >= 0.95 * a)

    for alternating, met in ((0.96 * b, True), (1.06 * b, False)):  # the alternated figure wins over s4's
        s16["alternated_with"] = {"label": s4["label"], "workers": 4, "tasks_per_s": {"median": alternating}}
        measured, passed = {t[0]: t[1:] for t in report().targets(results)}[name]
        assert measured == f"{b:,.0f} vs {alternating:,.0f} tasks/s ({b / alternating:.2f} x; repetitions alternating)"
        assert passed is met
