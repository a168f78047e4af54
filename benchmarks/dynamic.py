"""``make bench`` step 10 (dynamic workflows, docs/dynamic.md): one run whose task maps over a list of N items made
at run time (``for_each``), against a static run of N tasks, on the same workers (4 x concurrency 16), their
repetitions alternating (static, for_each, for_each, static, ...: this machine's speed drifts within minutes).

The for_each run is ``split`` (a mock task whose output is the list 0..N-1) then ``each`` (``for_each: split``,
``sleep_ms`` 0): its N instances are created in the transaction that completes ``split``, then run as any ready
task. Both runs have run concurrency 64 (the slots); both are timed from the database clock (run started_at ->
finished_at), so the for_each run's time includes ``split`` and the expansion. Target: for_each >= 0.8 x the static
run's tasks/s (N tasks each; the mapped task and ``split`` are not counted). Each scenario ends with
``awp.check_invariants()`` over its runs.
"""

from __future__ import annotations

import json
import logging
import statistics
from typing import Any

log = logging.getLogger("bench")


def _for_each_workflow(b: Any, n: int, concurrency: int) -> str:
    wid = f"bench-for-each-{n}-c{concurrency}"
    if wid not in b.workflows:
        definition = {
            "id": wid,
            "concurrency": concurrency,
            "tasks": [
                {"key": "split", "executor": "mock", "input": {"output": list(range(n))}},
                {
                    "key": "each",
                    "executor": "mock",
                    "depends_on": ["split"],
                    "for_each": "split",
                    "max_items": n,
                    "input": {"sleep_ms": 0},
                },
            ],
        }
        b.conn.execute("SELECT * FROM awp.create_workflow_version(%s)", [json.dumps(definition)])
        b.workflows.add(wid)
    return wid


def measure(b: Any, plan: Any) -> dict[str, Any]:
    """Step 10: {"static": summary, "for_each": summary, "pairs": [for_each / static per round], "ratio"}."""
    n, workers, conc = plan.dynamic_items, plan.batch_workers, plan.batch_concurrency
    slots = workers * conc
    static_wid = b.workflow(f"bench-static-{n}-c{slots}", n, slots)
    each_wid = _for_each_workflow(b, n, slots)
    static_label = f"1 run x {n:,} tasks (static), {workers} workers x concurrency {conc}"
    each_label = f"1 run, for_each over {n:,} items, {workers} workers x concurrency {conc}"
    log.info("dynamic workflows: %s against %s, %d rounds", each_label, static_label, plan.dynamic_repeats)
    b.pool.resize(workers, conc)
    static_reps: list[dict[str, Any]] = []
    each_reps: list[dict[str, Any]] = []
    try:
        for i in range(plan.dynamic_repeats):
            which = f"{i + 1}/{plan.dynamic_repeats}"
            for kind in ("static", "each") if i % 2 == 0 else ("each", "static"):
                if kind == "static":
                    static_reps.append(b.repetition(static_label, static_wid, 1, n, which))
                else:
                    each_reps.append(b.repetition(each_label, each_wid, 1, n, which))
    finally:
        b.pool.resize(0)
    static = b.summary(static_label, static_reps, 1, n) | {"workers": workers, "worker_concurrency": conc}
    each = b.summary(each_label, each_reps, 1, n) | {"workers": workers, "worker_concurrency": conc}
    pairs = [
        e["tasks_per_s"] / s["tasks_per_s"] for e, s in zip(each_reps, static_reps, strict=True) if s["tasks_per_s"]
    ]
    ratio = each["tasks_per_s"]["median"] / static["tasks_per_s"]["median"] if static["tasks_per_s"]["median"] else None
    log.info("  for_each / static: %s (pairs %s)", f"{ratio:.2f} x" if ratio else "-", [f"{p:.2f}" for p in pairs])
    return {
        "items": n,
        "static": static,
        "for_each": each,
        "pairs": pairs,
        "pairs_median": statistics.median(pairs) if pairs else None,
        "ratio": ratio,
    }
