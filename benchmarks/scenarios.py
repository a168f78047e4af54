"""Scenarios of ``make bench`` (``run.py``) beside ``Bench``'s own throughput runs: step 2's peer
(procrastinate, its repetitions alternating with AWP's), step 5's idle latency, step 6b's I/O-bound run (issue
18) and step 7's recovery after a kill -9."""

from __future__ import annotations

import logging
import random
import statistics
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import peer_procrastinate
import procs
from figures import median_spread, percentiles
from harness import Bench
from plans import DEFAULT_HEARTBEAT_MS, DEFAULT_LEASE_MS, Plan
from procs import Reaper

from awp.dev import procs as awp_procs
from awp_testing.cluster import one

log = logging.getLogger("bench")


def measure_peer(
    plan: Plan,
    peer_dsn: str | None,
    datadir: Path | None,
    workdir: Path,
    reaper: Reaper,
    beside: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """procrastinate in AWP's 4-worker single-run shape (see peer_procrastinate.py); never a silent skip:
    ``status`` is ``measured``, ``not installed`` or ``failed`` (with ``error``). ``beside(i)`` runs AWP's
    repetition i of that shape: after the peer's in even pairs, before it in odd ones (peer, AWP, AWP, peer,
    ...), so that a drift of the machine's speed weighs on both alike."""
    jobs = plan.single_tasks
    out: dict[str, Any] = {
        "name": "procrastinate",
        "version": peer_procrastinate.version(),
        "label": f"{jobs} no-op jobs deferred up front, {plan.peer_workers} worker processes x concurrency "
        f"{plan.peer_concurrency}",
        "jobs": jobs,
        "workers": plan.peer_workers,
        "worker_concurrency": plan.peer_concurrency,
        "connector": "PsycopgConnector",
    }
    if out["version"] is None:
        log.warning("peer: procrastinate is NOT installed (pip install -e '.[bench]'): not measured")
        return out | {"status": "not installed", "error": "pip install -e '.[bench]' (the bench extra)"}
    if peer_dsn is None:
        return out | {"status": "failed", "error": "no database for the peer"}

    def cpu_postgres() -> float | None:
        if not datadir:
            return None
        return procs.cpu_seconds([procs.postmaster_pid(datadir)], include_reaped_children=True)

    log.info("peer: procrastinate %s, %s", out["version"], out["label"])
    reps: list[dict[str, Any]] = []
    try:
        peer_procrastinate.apply_schema(peer_dsn)
        for i in range(plan.side_repeats):
            if beside is not None and i % 2 == 1:
                beside(i)
            r = peer_procrastinate.run_once(
                reaper,
                peer_dsn,
                workdir,
                jobs,
                plan.peer_workers,
                plan.peer_concurrency,
                procs.cpu_seconds,
                cpu_postgres,
                i + 1,
                timeout=max(120.0, jobs / 10),
            )
            reps.append(r)
            log.info(
                "  procrastinate, repetition %d/%d: %.0f jobs/s (%d jobs in %.2fs; jobs per worker %s)",
                i + 1,
                plan.side_repeats,
                r["tasks_per_s"],
                jobs,
                r["span_s"],
                r["jobs_per_worker"],
            )
            if beside is not None and i % 2 == 0:
                beside(i)
    except Exception as exc:
        log.exception("peer: procrastinate measurement FAILED")
        return out | {"status": "failed", "error": f"{type(exc).__name__}: {exc}", "repetitions": reps}
    return out | {
        "status": "measured",
        "tasks_per_s": median_spread([r["tasks_per_s"] for r in reps]),
        "cpu_ms_per_task": {
            k: median_spread([r["cpu_ms_per_task"][k] for r in reps if r["cpu_ms_per_task"][k] is not None])
            for k in ("workers", "postgres")
        },
        "repetitions": reps,
    }


def latency(b: Bench, samples: int) -> dict[str, Any]:
    before = b.snapshot()
    claims = b.idle_claims(samples)
    dispatch_ms, claim_ms, finish_ms = claims["dispatch_ms"], claims["claim_ms"], claims["finish_ms"]
    m = b.measured(before, samples)
    log.info(
        "  idle latency: dispatch p50 %.1f ms, claim p50 %.1f ms, finish p50 %.1f ms",
        statistics.median(dispatch_ms),
        statistics.median(claim_ms),
        statistics.median(finish_ms),
    )
    label = f"idle, 1-task run, {len(b.pool.workers)} workers long-polling"
    return {
        "label": label,
        "invariants": b.invariants("idle latency"),
        "samples": samples,
        "dispatch_ms": percentiles(dispatch_ms, (0.5, 0.95)) | {"values": dispatch_ms},
        "claim_ms": percentiles(claim_ms, (0.5, 0.95)) | {"values": claim_ms},
        "finish_ms": percentiles(finish_ms, (0.5, 0.95)) | {"values": finish_ms},
        "claims": m["claims"],
        "coordinator": m["coordinator"],
    }


def io_bound(b: Bench, plan: Plan) -> dict[str, Any]:
    """Issue 18: an I/O-bound run (LLM calls, say) on the default settings: ``io_tasks`` mock tasks of
    ``io_sleep_ms`` on ``io_workers`` x ``io_concurrency`` slots, run concurrency = tasks (the run does not
    cap). The ideal is io_tasks x io_sleep_ms / slots; the old default dispatch_limit (100) took twice that
    on 200 slots. Also the peak number of attempts at once and what held the waiting tasks (sampled)."""
    slots = plan.io_workers * plan.io_concurrency
    ideal_s = plan.io_tasks * plan.io_sleep_ms / 1000 / slots
    b.pool.resize(0)
    b.pool.resize(plan.io_workers, plan.io_concurrency)
    wid = b.workflow(
        f"bench-io-{plan.io_tasks}-{plan.io_sleep_ms}",
        plan.io_tasks,
        plan.io_tasks,
        {"input": {"sleep_ms": plan.io_sleep_ms}},
    )
    label = (
        f"I/O-bound: 1 run x {plan.io_tasks:,} tasks x {plan.io_sleep_ms / 1000:g} s, "
        f"{plan.io_workers} workers x concurrency {plan.io_concurrency} ({slots} slots)"
    )
    reps = []
    for i in range(plan.io_repeats):
        time.sleep(0.3)
        (run_id,) = b.start_runs(wid)
        reasons: Counter[str] = Counter()
        deadline = time.monotonic() + max(120.0, 10 * ideal_s)
        while time.monotonic() < deadline:
            rows = b.conn.execute("SELECT reason, count(*) FROM awp.run_waits(%s) GROUP BY 1", [run_id]).fetchall()
            for reason, n in rows:
                reasons[reason] = max(reasons[reason], n)  # the most tasks held for each reason at once
            if not rows:
                break
            time.sleep(0.5)
        (row,) = b.wait_runs([run_id], timeout=max(120.0, 10 * ideal_s))
        span = (row["finished_at"] - row["started_at"]).total_seconds()
        peak = one(
            b.conn,
            """SELECT max(s) FROM (
                 SELECT sum(d) OVER (ORDER BY ts, d ROWS UNBOUNDED PRECEDING) AS s FROM (
                   SELECT started_at AS ts, 1 AS d FROM awp.attempts WHERE run_id = %(r)s
                   UNION ALL
                   SELECT finished_at, -1 FROM awp.attempts WHERE run_id = %(r)s) e) x""",
            {"r": run_id},
        )[0]
        reps.append({"span_s": span, "peak_concurrency": peak, "max_waiting_by_reason": dict(reasons)})
        log.info(
            "  %s, repetition %d/%d: %.2f s (ideal %.1f s, %.2f x), peak %d attempts at once, waiting: %s",
            label,
            i + 1,
            plan.io_repeats,
            span,
            ideal_s,
            span / ideal_s,
            peak,
            dict(reasons),
        )
    spans = [r["span_s"] for r in reps]
    return {
        "label": label,
        "tasks": plan.io_tasks,
        "sleep_ms": plan.io_sleep_ms,
        "workers": plan.io_workers,
        "worker_concurrency": plan.io_concurrency,
        "slots": slots,
        "dispatch_limit": one(b.conn, "SELECT awp.get_settings()->>'dispatch_limit'")[0],
        "ideal_s": ideal_s,
        "span_s": median_spread(spans),
        "ratio_to_ideal": statistics.median(spans) / ideal_s if spans else None,
        "peak_concurrency": max(r["peak_concurrency"] for r in reps) if reps else None,
        "repetitions": reps,
        "invariants": b.invariants("I/O-bound"),
    }


def recovery(b: Bench, label: str, lease_ms: int, heartbeat_ms: int, repeats: int) -> dict[str, Any]:
    """kill -9 the worker holding a lease; time until attempt 2 is claimed (all database clock)."""
    b.configure(lease_ms, heartbeat_ms)
    b.pool.resize(0)
    b.pool.resize(2, 1)  # new sessions take the new heartbeat interval
    wid = b.workflow(
        "bench-recovery",
        1,
        1,
        {"input": {"sleep_ms": 3_600_000}, "retry": {"max_attempts": 2, "interval_ms": 0}},
    )
    samples = []
    for i in range(repeats):
        (run_id,) = b.start_runs(wid)
        first = wait_for(
            lambda rid=run_id: b.conn.execute(
                "SELECT worker_id FROM awp.attempts WHERE run_id = %s AND attempt = 1", [rid]
            ).fetchone(),
            30,
            "attempt 1",
        )
        victim = b.pool.by_worker_id(first[0])
        if victim is None:
            raise RuntimeError(f"attempt 1 is held by an unknown worker {first[0]}")
        time.sleep(random.uniform(0, heartbeat_ms / 1000))  # kill at a random point of the heartbeat cycle
        (killed_at,) = one(b.conn, "SELECT clock_timestamp()")
        b.pool.kill9(victim)
        second = wait_for(
            lambda rid=run_id: b.conn.execute(
                "SELECT a2.started_at, a1.finished_at, a1.status FROM awp.attempts a2"
                " JOIN awp.attempts a1 ON a1.run_id = a2.run_id AND a1.task_key = a2.task_key AND a1.attempt = 1"
                " WHERE a2.run_id = %s AND a2.attempt = 2",
                [rid],
            ).fetchone(),
            lease_ms / 1000 + 30,
            "attempt 2",
        )
        sample = {
            "takeover_ms": (second[0] - killed_at).total_seconds() * 1000,
            "detected_ms": (second[1] - killed_at).total_seconds() * 1000,  # attempt 1 settled (reaped)
            "attempt1_status": second[2],
        }
        samples.append(sample)
        log.info(
            "  recovery (%s lease), repetition %d/%d: attempt 2 claimed %.0f ms after the kill "
            "(attempt 1 %s after %.0f ms)",
            label,
            i + 1,
            repeats,
            sample["takeover_ms"],
            sample["attempt1_status"],
            sample["detected_ms"],
        )
        b.conn.execute("SELECT awp.request_cancel(%s)", [run_id])
        wait_for(
            lambda rid=run_id: b.conn.execute(
                "SELECT 1 FROM awp.runs WHERE run_id = %s AND finished_at IS NOT NULL", [rid]
            ).fetchone(),
            30,
            "the canceled run to finish",
        )
        b.pool.resize(2, 1)
    b.pool.resize(0)
    b.configure(DEFAULT_LEASE_MS, DEFAULT_HEARTBEAT_MS)
    return {
        "label": label,
        "invariants": b.invariants(f"recovery ({label} lease)"),
        "lease_ms": lease_ms,
        "heartbeat_ms": heartbeat_ms,
        "takeover_ms": median_spread([s["takeover_ms"] for s in samples]),
        "detected_ms": median_spread([s["detected_ms"] for s in samples]),
        "samples": samples,
    }


def wait_for(probe: Any, timeout: float, what: str, poll: float = 0.01) -> Any:
    """Poll every 10 ms by default: these waits time a takeover."""
    return awp_procs.wait_for(probe, timeout, what, poll)
