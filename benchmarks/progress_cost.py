"""``make bench`` step 12 (live output, docs/progress.md; AWP issue 45): the hot path's cost of ``ctx.log``. One run
of N mock tasks whose every task logs 10 lines (mock input ``"logs": 10``: ten ``ctx.log`` calls, sent by the worker's
batcher, the rest before the task's result) against the same run logging none, on the same workers, repetitions
alternating (none, logs, logs, none, ...: this machine's speed drifts within minutes). Two shapes: 4 workers x 1
(step 2's shape, one task at a time per worker: the batcher's last write goes before each result) and 4 workers x
concurrency 16 (step 6's: many leases' writes share a request). Target: logs >= 0.9 x none tasks/s in each shape.
Each scenario ends with ``awp.check_invariants()``; the lines kept are counted (all of them must be there).
"""

from __future__ import annotations

import logging
import statistics
from typing import Any

log = logging.getLogger("bench")

LINES = 10
TARGET = 0.9


def _shape(b: Any, n: int, workers: int, conc: int, repeats: int) -> dict[str, Any]:
    slots = workers * conc
    none_wid = b.workflow(f"bench-logs0-{n}-c{slots}", n, slots)
    logs_wid = b.workflow(f"bench-logs{LINES}-{n}-c{slots}", n, slots, {"input": {"sleep_ms": 0, "logs": LINES}})
    shape = f"1 run x {n:,} tasks, {workers} workers x concurrency {conc}"
    b.pool.resize(workers, conc)
    reps: dict[str, list[dict[str, Any]]] = {"none": [], "logs": []}
    run_ids: list[str] = []
    try:
        for i in range(repeats):
            which = f"{i + 1}/{repeats}"
            for kind in ("none", "logs") if i % 2 == 0 else ("logs", "none"):
                wid, label = (none_wid, "no logs") if kind == "none" else (logs_wid, f"{LINES} log lines per task")
                m = b.repetition(f"{shape}, {label}", wid, 1, n, which)
                run_ids += m["run_ids"]
                reps[kind].append(m)
    finally:
        b.pool.resize(0)
    kept = b.conn.execute(
        "SELECT sum(cardinality(entries)) FROM awp.task_output WHERE run_id = ANY(%s) AND kind = 'log'", [run_ids]
    ).fetchone()[0]
    none = b.summary(f"{shape}, no logs", reps["none"], 1, n)
    logs = b.summary(f"{shape}, {LINES} log lines per task", reps["logs"], 1, n)
    pairs = [
        lg["tasks_per_s"] / no["tasks_per_s"]
        for lg, no in zip(reps["logs"], reps["none"], strict=True)
        if no["tasks_per_s"]
    ]
    ratio = logs["tasks_per_s"]["median"] / none["tasks_per_s"]["median"] if none["tasks_per_s"]["median"] else None
    log.info(
        "  %s: logs / none = %s (pairs %s)", shape, f"{ratio:.2f} x" if ratio else "-", [f"{p:.2f}" for p in pairs]
    )
    return {
        "label": shape,
        "workers": workers,
        "worker_concurrency": conc,
        "none": none,
        "logs": logs,
        "pairs": pairs,
        "ratio": ratio,
        "lines_kept": kept,
        "lines_expected": LINES * n * len(reps["logs"]),
    }


def measure(b: Any, plan: Any) -> dict[str, Any]:
    """Step 12: {"shapes": [per shape: none, logs, pairs, ratio, lines kept], "target": 0.9}."""
    n = plan.single_tasks
    shapes = [
        _shape(b, n, plan.peer_workers, 1, plan.side_repeats),
        _shape(b, plan.batch_tasks, plan.batch_workers, plan.batch_concurrency, plan.repeats),
    ]
    return {"shapes": shapes, "target": TARGET, "lines": LINES}


def table(results: dict[str, Any]) -> str:
    """A plain-text table of step 12 (printed by ``--progress-only``)."""
    out = [f"Live output (issue 45): every task logs {results['lines']} lines vs none, repetitions alternating"]
    for s in results["shapes"]:
        med = {k: s[k]["tasks_per_s"]["median"] for k in ("none", "logs")}
        out.append(
            f"  {s['label']}: none {med['none']:.0f} tasks/s, logs {med['logs']:.0f} tasks/s, ratio "
            f"{s['ratio']:.2f} (pairs {', '.join(f'{p:.2f}' for p in s['pairs'])}; median pair "
            f"{statistics.median(s['pairs']):.2f}); lines kept {s['lines_kept']:,} of {s['lines_expected']:,};"
            f" target >= {results['target']}: {'PASS' if s['ratio'] and s['ratio'] >= results['target'] else 'MISS'}"
        )
    return "\n".join(out)
