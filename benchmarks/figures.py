"""The figures of a benchmark's repetitions: medians with their spread, nearest-rank percentiles, and the summary of a
throughput scenario's repetitions (``harness.py``'s Bench; ``many_load.py``)."""

from __future__ import annotations

import math
import statistics
from typing import Any


def median_spread(values: list[float]) -> dict[str, Any]:
    return {
        "median": statistics.median(values) if values else None,
        "min": min(values) if values else None,
        "max": max(values) if values else None,
        "n": len(values),
        "values": values,
    }


def percentiles(samples: list[float], qs: tuple[float, ...] = (0.5, 0.95, 0.99)) -> dict[str, Any]:
    """Nearest-rank percentiles (p50, p95, p99) and the sample count."""
    ordered = sorted(samples)
    out: dict[str, Any] = {"n": len(ordered)}
    for q in qs:
        key = f"p{round(q * 100)}"
        out[key] = ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))] if ordered else None
    return out


def summarize(label: str, reps: list[dict[str, Any]], runs: int, tasks_per_run: int) -> dict[str, Any]:
    routes = {
        "claim": "/api/v1/workers/{worker_id}/claims",
        "heartbeat": "/api/v1/workers/{worker_id}/heartbeat",
        "complete": "/api/v1/workers/{worker_id}/leases/{dispatch_id}/complete",
        "completions": "/api/v1/workers/{worker_id}/completions",  # several results (and claims) per request
    }
    latency = {
        name: percentiles([ms for r in reps for ms in r["durations_ms"].get(route, [])])
        for name, route in routes.items()
    }
    tasks = sum(r["tasks"] for r in reps)
    empty = sum(r["claims"]["empty"] for r in reps)
    leased = sum(r["claims"]["leased"] for r in reps)
    return {
        "label": label,
        "runs": runs,
        "tasks_per_run": tasks_per_run,
        "tasks_per_s": median_spread([r["tasks_per_s"] for r in reps]),
        "latency_ms": latency,
        "claims": {"empty": empty, "leased": leased, "empty_per_task": empty / tasks if tasks else None},
        "coordinator": {
            "passes_per_rep": statistics.median(r["coordinator"]["passes"] for r in reps),
            "dispatched_share": sum(r["coordinator"]["dispatched"] for r in reps) / tasks if tasks else None,
        },
        "requests_per_task": {
            name: sum(len(r["durations_ms"].get(route, [])) for r in reps) / tasks for name, route in routes.items()
        },
        "cpu_s": {k: _median_or_none([r["cpu_s"][k] for r in reps]) for k in ("gateway", "workers", "postgres")},
        # CPU per task of each process kind, and the gateway's per HTTP request (every route, from the access
        # log), per repetition: median and min-max like tasks/s. The gateway's includes its coordinator.
        "cpu_ms_per_task": {
            k: median_spread([r["cpu_s"][k] * 1000 / r["tasks"] for r in reps if r["cpu_s"][k] is not None])
            for k in ("gateway", "workers", "postgres")
        },
        "gateway_cpu_ms_per_request": median_spread(
            [r["cpu_s"]["gateway"] * 1000 / r["requests"] for r in reps if r["requests"]]
        ),
        "peak_rss_mb": {k: max(r["peak_rss_mb"][k] for r in reps) for k in ("gateway", "workers")},
        "submit_to_start_ms": statistics.median(r["submit_to_start_ms"] for r in reps),
        "repetitions": [{k: v for k, v in r.items() if k not in ("durations_ms", "run_ids")} for r in reps],
    }


def _median_or_none(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None
