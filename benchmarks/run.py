"""``make bench`` / ``make bench-quick``: AWP's throughput, latency and recovery, beside this machine's limit.

    .venv/bin/python benchmarks/run.py            # full: every figure 3 times, side by side 5 (about 13 minutes)
    .venv/bin/python benchmarks/run.py --quick    # reduced sizes, for a smoke test (about 3 minutes)
    .venv/bin/python benchmarks/run.py --quick --profile   # + pg_stat_statements top statements per scenario
    .venv/bin/python benchmarks/run.py --many-runs-only [--quick]   # step 9 alone (about 7 / 1.5 minutes)

One fresh throwaway PostgreSQL cluster (fsync on) and one fresh migrated database; one real ``awp serve``
(gateway + coordinator, default settings) and real ``awp worker`` processes; in order:

1. the reference: a plain-SQL SKIP LOCKED claim + complete loop run by pgbench (1, 4 and 8 clients), in a
   database of its own;
2. side by side, their repetitions alternating (peer, AWP, AWP, peer, peer, AWP, ...: this machine's speed
   drifts within minutes, so a ratio of figures measured minutes apart says more about the machine than about
   the systems): the peer, procrastinate (``peer_procrastinate.py``) in a separate fresh database of the same
   cluster, N no-op jobs deferred up front, 4 worker processes x concurrency 1; and AWP in that shape, one run of
   N mock tasks on 4 workers (after an untimed warm-up run). AWP's workers are stopped during the peer's
   repetitions; its gateway stays up, idle (its coordinator's pass once a second is the only other load);
3. one run of N independent mock tasks (``sleep_ms`` 0), run concurrency = workers, 1 / 16 workers (4: step 2);
   the 16 workers' repetitions alternate with as many of step 2's 4-worker run, which target (2) compares them with;
4. 8 runs of 125 tasks at once, 16 and 4 workers;
5. idle latency: one 1-task run at a time → time to claim and to finish;
6. batching: 4 workers with ``--concurrency 16`` on one big run;
6b. I/O-bound (issue 18): 2,000 tasks of 2 s (``sleep_ms`` 2000) on 2 workers x concurrency 100 = 200 slots,
   default settings: the time against the ideal 20 s (target: within 10%), the peak number of attempts at once
   and what held the waiting tasks (``awp.run_waits``); ``--io-only`` runs just this one;
7. recovery: kill -9 the worker holding a lease → time until the next attempt is claimed;
8. retention (``retention.py``): one ``/metrics`` scrape with 100 and with 100,000 finished runs, one prune
   batch, and pruning them all;
9. many runs (issue 46, ``many_runs.py``, whose docstring says how each is measured), on 4 workers x 1:
   a. 1,000 runs x 10 tasks (run concurrency 4) and 10,000 runs x 1 task, each started in one transaction and
      timed from its commit, their 2 rounds alternating with one run of 1,000 tasks started the same way: targets
      >= 0.8 x and >= 0.6 x that run's tasks/s (the base measured in the same minutes, not step 2's median,
      which is earlier and, with ``--quick``, of 200 tasks; the table gives both ratios);
   b. a backlog of 100,000 ready tasks over 1,000 runs of a kind no worker serves: idle claim p50 and
      PostgreSQL CPU per task (one run of 1,000) against an empty queue (before and after it), targets <= 1.2 x;
   c. a coordinator pass (``awp.coordinator_tick(false, NULL, false)`` from SQL) with 10,000 live runs and nothing
      to dispatch: p50 < 20 ms (and the 2-argument form, with "limited", no target);
   d. logging: INFO (the default) against WARNING for the gateway and the workers, repetitions alternating:
      target INFO >= 0.9 x WARNING tasks/s;
   e. POST .../runs with 8 concurrent clients (and 1): target >= 300 runs/s.
   Its targets also raise two of step 2's: AWP >= 1.5 x procrastinate and PostgreSQL CPU per task <= 0.7 ms (the
   issue-11 targets, 1.0 x and 2 ms, stay beside them). ``--quick``: 100 x 10 and 1,000 x 1 runs, a backlog of
   10,000 tasks, 2,000 live runs for the pass, 3 s of starts.
10. dynamic workflows (issue 39, ``dynamic.py``): one run with a ``for_each`` over 5,000 items against a static run
   of 5,000 tasks, 4 workers x concurrency 16, rounds alternating: target >= 0.8 x (``--quick``: 1,000 items).
11. rate limits (issue 40, ``pacing.py``): a run of 2,000 tasks behind max_in_flight 50 on 200 slots, sampled: exactly
   50 in flight; a per_window limit of 100 per second: at most 100 starts in any second, and at most 101/s over
   20 s (``--quick``: 1,000 tasks, 5 s).
12. live output (issue 45, ``progress_cost.py``): one run whose every task logs 10 lines (``ctx.log``) against the
   same run logging none, 4 workers x 1 and 4 x concurrency 16, repetitions alternating: target >= 0.9 x;
   ``--progress-only`` runs just this one (about 3 minutes; ``--quick``: 1).

Every AWP scenario ends with ``awp.check_invariants()`` (whole database; step 9: over its own runs, 1,000 a call, as
a whole-database call costs runs x tasks there); violations are reported per scenario and make the exit status 1
(after the results are written), as do a failed peer measurement and a failed step-9 scenario.

Throughput comes from database timestamps (run started_at → finished_at; procrastinate: first
``started`` → last ``succeeded`` event); request latencies from the gateway's access log; claim results
from ``/metrics``; CPU and peak RSS from ``/proc``. Results are printed and written to
``benchmarks/results/`` (``bench-<timestamp>.json``, ``latest.json``, ``latest.md``, ``latest.png``).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import logging
import os
import platform
import random
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

# this folder's modules (peer_procrastinate, procs, ...): a script's own folder is first on sys.path
import dynamic
import many_runs
import pacing
import peer_procrastinate
import procs
import progress_cost
import psycopg
import reference
import report
import retention
from figures import median_spread, percentiles, summarize
from procs import Gateway, Reaper, WorkerPool

from awp.dev import procs as awp_procs
from awp_testing.cluster import database_name, fresh_database, one, throwaway_cluster

HERE = Path(__file__).resolve().parent

log = logging.getLogger("bench")
RESULTS = HERE / "results"

DEFAULT_LEASE_MS = 15000
DEFAULT_HEARTBEAT_MS = 5000
WARM_UP_TASKS = 200  # AWP's untimed run before the side-by-side repetitions (fresh backends, plan caches)


@dataclass(frozen=True)
class Plan:
    name: str
    repeats: int  # of every throughput and recovery figure
    single_tasks: int
    single_workers: tuple[int, ...]
    multi_runs: int
    multi_tasks: int
    multi_workers: tuple[int, ...]
    batch_tasks: int  # in quick mode: the most; sized to about 8 s at the 4-worker rate measured before
    batch_repeats: int
    batch_workers: int
    batch_concurrency: int
    latency_samples: int
    recovery: tuple[tuple[str, int, int], ...]  # (label, lease_ms, heartbeat_ms)
    ref_clients: tuple[int, ...]
    ref_seconds: float
    ref_rows: int
    peer_workers: int  # procrastinate: processes x concurrency, on single_tasks jobs (AWP's 4-worker shape)
    peer_concurrency: int
    side_repeats: int  # of the side-by-side figures (AWP and the peer, alternating): the ratio that matters most
    # I/O-bound (issue 18): io_tasks mock tasks of io_sleep_ms each on io_workers x io_concurrency slots, default
    # settings; the ideal is io_tasks x io_sleep_ms / slots
    io_tasks: int = 2000
    io_sleep_ms: int = 2000
    io_workers: int = 2
    io_concurrency: int = 100
    io_repeats: int = 1
    # Many runs (issue 46; many_runs.py), all on many_workers workers x concurrency 1: (runs, tasks per run) started
    # in one transaction, their rounds alternating with one run of many_base_tasks (the base of their targets)
    many_workers: int = 4
    many_shapes: tuple[tuple[int, int], ...] = ((1000, 10), (10000, 1))
    many_base_tasks: int = 1000
    many_repeats: int = 2  # rounds; 10,000 runs x 1 task take about a minute a round on this machine
    # a backlog of backlog_runs x backlog_tasks ready tasks of a kind no worker serves: idle claims
    # (backlog_samples) and one run of many_base_tasks (backlog_repeats) with and without it
    backlog_runs: int = 1000
    backlog_tasks: int = 100
    backlog_samples: int = 30
    backlog_repeats: int = 3
    pass_runs: int = 10000  # live runs that nothing can dispatch, during pass_samples coordinator passes
    pass_samples: int = 50
    start_clients: tuple[int, ...] = (8, 1)  # POST .../runs: concurrent clients, start_seconds each
    start_seconds: float = 5.0
    log_pairs: int = 3  # logging: pairs of repetitions (INFO, WARNING), alternating
    # Dynamic workflows (issue 39; dynamic.py): a for_each over dynamic_items against a static run of as many tasks,
    # batch_workers x batch_concurrency, dynamic_repeats rounds alternating
    dynamic_items: int = 5000
    dynamic_repeats: int = 3
    # Rate limits (issue 40; pacing.py): pacing_tasks behind max_in_flight 50; per_window 100/s over pacing_seconds
    pacing_tasks: int = 2000
    pacing_seconds: float = 20.0


FULL = Plan(
    name="full",
    repeats=3,
    single_tasks=1000,
    single_workers=(1, 4, 16),
    multi_runs=8,
    multi_tasks=125,
    multi_workers=(16, 4),
    batch_tasks=10000,
    batch_repeats=3,
    batch_workers=4,
    batch_concurrency=16,
    latency_samples=50,
    recovery=(("default", DEFAULT_LEASE_MS, DEFAULT_HEARTBEAT_MS), ("short", 2000, 500)),
    ref_clients=(1, 4, 8),
    ref_seconds=5,
    ref_rows=300_000,
    peer_workers=4,
    peer_concurrency=1,
    side_repeats=5,
)

QUICK = replace(
    FULL,
    name="quick",
    repeats=2,
    side_repeats=2,
    single_tasks=200,
    multi_tasks=25,
    batch_tasks=2000,
    batch_repeats=1,
    latency_samples=15,
    recovery=(("short", 2000, 500),),
    ref_seconds=2,
    ref_rows=60_000,
    io_tasks=1000,  # 5 rounds of the 200 slots: ideal 10 s
    many_shapes=((100, 10), (1000, 1)),
    many_repeats=2,
    backlog_runs=100,
    backlog_samples=15,
    backlog_repeats=2,
    pass_runs=2000,
    pass_samples=30,
    start_seconds=3.0,
    log_pairs=2,
    dynamic_items=1000,
    dynamic_repeats=2,
    pacing_tasks=1000,
    pacing_seconds=5.0,
)


class Bench:
    """The cluster, the gateway and the worker pool of one benchmark run, plus the measurement helpers."""

    def __init__(self, dsn: str, datadir: Path | None, workdir: Path, reaper: Reaper, profile: bool = False) -> None:
        self.dsn = dsn
        self.profile = profile
        self.datadir = datadir
        self.workdir = workdir
        self.reaper = reaper
        self.conn = psycopg.connect(dsn, autocommit=True)
        self.gateway = Gateway(reaper, dsn, workdir)
        self.pool = WorkerPool(reaper, self.gateway, workdir, self.conn)
        self.workflows: set[str] = set()

    # ---- set-up -----------------------------------------------------------------------------------------

    def postgres_pids(self) -> list[int]:
        return [procs.postmaster_pid(self.datadir)] if self.datadir else []

    def invariants(self, label: str) -> dict[str, Any]:
        """``awp.check_invariants()`` over the whole database, at the end of a scenario (all runs finished)."""
        rows = self.conn.execute(
            "SELECT invariant, run_id, entity_key, detail FROM awp.check_invariants() ORDER BY 1, 2, 3"
        ).fetchall()
        by_invariant = dict(Counter(r[0] for r in rows))
        if rows:
            log.error("  %s: awp.check_invariants() returned %d violation(s): %s", label, len(rows), by_invariant)
        else:
            log.info("  %s: awp.check_invariants() empty", label)
        keys = ("invariant", "run_id", "entity_key", "detail")
        return {
            "violations": len(rows),
            "by_invariant": by_invariant,
            "sample": [dict(zip(keys, r, strict=True)) for r in rows[:20]],
        }

    def configure(self, lease_ms: int, heartbeat_ms: int) -> None:
        self.conn.execute(
            "SELECT awp.configure(lease_duration_ms => %s, heartbeat_interval_ms => %s)", [lease_ms, heartbeat_ms]
        )

    def workflow(self, wid: str, tasks: int, concurrency: int, task: dict[str, Any] | None = None) -> str:
        if wid not in self.workflows:
            base = {"executor": "mock", "input": {"sleep_ms": 0}, **(task or {})}
            definition = {
                "id": wid,
                "concurrency": concurrency,
                "tasks": [{"key": f"t{i:05d}", **base} for i in range(tasks)],
            }
            self.conn.execute("SELECT * FROM awp.create_workflow_version(%s)", [json.dumps(definition)])
            self.workflows.add(wid)
        return wid

    def start_runs(self, wid: str, n: int = 1) -> list[str]:
        with self.conn.transaction():  # n runs appear at once, like a burst of submissions
            return [one(self.conn, "SELECT awp.start_run(%s)", [wid])[0] for _ in range(n)]

    def wait_runs(self, run_ids: list[str], timeout: float, poll: float = 0.02) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while True:
            rows = self.conn.execute(
                "SELECT run_id, status, created_at, started_at, finished_at FROM awp.runs WHERE run_id = ANY(%s)",
                [run_ids],
            ).fetchall()
            if all(r[4] is not None for r in rows) and len(rows) == len(run_ids):
                out = [
                    dict(zip(("run_id", "status", "created_at", "started_at", "finished_at"), r, strict=True))
                    for r in rows
                ]
                bad = [r for r in out if r["status"] != "succeeded"]
                if bad:
                    raise RuntimeError(f"runs did not succeed: {bad}")
                return out
            if time.monotonic() > deadline:
                counts = self.conn.execute(
                    "SELECT status, count(*) FROM awp.tasks WHERE run_id = ANY(%s) GROUP BY 1", [run_ids]
                ).fetchall()
                raise TimeoutError(f"runs not finished after {timeout:.0f}s; tasks by status: {dict(counts)}")
            time.sleep(poll)

    def start_many(self, wid: str, runs: int) -> tuple[list[str], Any]:
        """``runs`` runs of ``wid`` in one transaction (``awp.start_runs``, 1,000 a call); returns their ids and the
        database clock just after the commit (the runs appear at once, as in a burst of submissions)."""
        run_ids: list[str] = []
        with self.conn.transaction():
            for lo in range(0, runs, 1000):
                items = json.dumps([{}] * min(1000, runs - lo))
                rows = self.conn.execute("SELECT run_id FROM awp.start_runs(%s, NULL, %s)", [wid, items]).fetchall()
                run_ids += [r[0] for r in rows]
        return run_ids, one(self.conn, "SELECT clock_timestamp()")[0]

    def wait_live(self, wid: str, timeout: float, poll: float = 0.1) -> None:
        """Until no run of ``wid`` is live (pending or running): one count over runs_live_idx per poll, cheap with
        thousands of runs, where ``wait_runs`` sends every id each time."""
        deadline = time.monotonic() + timeout
        while True:
            live = one(
                self.conn,
                "SELECT count(*) FROM awp.runs WHERE workflow_id = %s AND status IN ('pending', 'running')",
                [wid],
            )[0]
            if not live:
                return
            if time.monotonic() > deadline:
                counts = self.conn.execute(
                    "SELECT t.status, count(*) FROM awp.tasks t JOIN awp.runs r USING (run_id)"
                    " WHERE r.workflow_id = %s AND r.status IN ('pending', 'running') GROUP BY 1",
                    [wid],
                ).fetchall()
                raise TimeoutError(f"{live} runs of {wid} live after {timeout:.0f}s; their tasks: {dict(counts)}")
            time.sleep(poll)

    def invariants_of(self, label: str, run_ids: list[str], chunk: int = 1000) -> dict[str, Any]:
        """``awp.check_invariants(run_ids)`` over these runs, ``chunk`` at a time (each call also checks the global
        invariants: worker capacity, dispatch limit). Not one whole-database call: its cost grows with runs x
        tasks (measured: 7 s at 10,000 one-task runs, 39 s at 20,000, 83 s at 11,000 runs of 110,000 tasks), which
        the many-run scenarios of issue 46 would turn into minutes per check."""
        rows: list[Any] = []
        started = time.monotonic()
        for lo in range(0, len(run_ids), chunk):
            rows += self.conn.execute(
                "SELECT invariant, run_id, entity_key, detail FROM awp.check_invariants(%s) ORDER BY 1, 2, 3",
                [run_ids[lo : lo + chunk]],
            ).fetchall()
        rows = list(dict.fromkeys(rows))  # a global invariant's row comes once per call
        by_invariant = dict(Counter(r[0] for r in rows))
        took = time.monotonic() - started
        if rows:
            log.error("  %s: awp.check_invariants() returned %d violation(s): %s", label, len(rows), by_invariant)
        else:
            log.info("  %s: awp.check_invariants() empty (%d runs, %.1f s)", label, len(run_ids), took)
        keys = ("invariant", "run_id", "entity_key", "detail")
        return {
            "violations": len(rows),
            "by_invariant": by_invariant,
            "sample": [dict(zip(keys, r, strict=True)) for r in rows[:20]],
            "runs_checked": len(run_ids),
            "check_s": round(took, 2),
        }

    # ---- one measured window -----------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        return {
            "metrics": self.gateway.metrics(),
            "log_offset": self.gateway.log_offset(),
            "cpu_gateway": procs.cpu_seconds([self.gateway.pid]),
            "cpu_workers": procs.cpu_seconds(self.pool.pids()),
            "cpu_postgres": procs.cpu_seconds(self.postgres_pids(), include_reaped_children=True),
        }

    def measured(self, before: dict[str, Any], tasks: int) -> dict[str, Any]:
        after = self.snapshot()
        claims = procs.claims_by_result(before["metrics"], after["metrics"])
        durations = self.gateway.access_durations(before["log_offset"], after["log_offset"])
        cpu = {k: after[f"cpu_{k}"] - before[f"cpu_{k}"] for k in ("gateway", "workers", "postgres")}
        if not self.datadir:  # an external server (AWP_TEST_DSN): its processes are not ours to read
            cpu["postgres"] = None
        return {
            "coordinator": procs.coordinator_work(before["metrics"], after["metrics"]),
            "durations_ms": durations,
            "claims": claims,
            "tasks": tasks,
            "requests": sum(len(v) for v in durations.values()),  # every route the access log saw
            "cpu_s": cpu,
            "peak_rss_mb": {
                "gateway": procs.peak_rss_mb(self.gateway.pid),
                "workers": self.pool.current_peak_rss_mb(),
            },
        }

    # ---- scenarios ---------------------------------------------------------------------------------------

    def throughput(self, label: str, wid: str, runs: int, tasks_per_run: int, repeats: int) -> dict[str, Any]:
        if self.profile:
            self.conn.execute("SELECT pg_stat_statements_reset()")
        reps = [self.repetition(label, wid, runs, tasks_per_run, f"{i + 1}/{repeats}") for i in range(repeats)]
        return self.summary(label, reps, runs, tasks_per_run)

    def throughput_against(
        self, label: str, wid: str, workers: int, tasks: int, repeats: int, against: tuple[str, str, int]
    ) -> dict[str, Any]:
        """One run of ``tasks`` on ``workers`` workers, its repetitions alternating with as many of the same run
        on fewer workers (``against``: label, workflow, workers; in turns: n, few, few, n, n, few, ...), so that
        the two medians come from the same minutes: on this machine, figures taken minutes apart differ by 20% and
        more (target (2) of issue 11: more workers on one run are not slower). The summary is that of the
        ``workers`` repetitions, with the others' tasks/s under ``alternated_with``."""
        other_label, other_wid, other_workers = against
        if self.profile:
            self.conn.execute("SELECT pg_stat_statements_reset()")
        reps: list[dict[str, Any]] = []
        others: list[dict[str, Any]] = []
        for i in range(repeats):
            which = f"{i + 1}/{repeats}"
            for n in (workers, other_workers) if i % 2 == 0 else (other_workers, workers):
                self.pool.resize(n, 1)
                if n == workers:
                    reps.append(self.repetition(label, wid, 1, tasks, which))
                else:
                    others.append(self.repetition(f"{other_label} (alternating)", other_wid, 1, tasks, which))
        alternated = {
            "label": other_label,
            "workers": other_workers,
            "tasks_per_s": median_spread([r["tasks_per_s"] for r in others]),
        }
        return self.summary(label, reps, 1, tasks) | {"workers": workers, "alternated_with": alternated}

    def repetition(self, label: str, wid: str, runs: int, tasks_per_run: int, which: str) -> dict[str, Any]:
        """One repetition of a throughput scenario: ``runs`` runs of ``wid`` at once, on the workers running now."""
        total = runs * tasks_per_run
        time.sleep(0.3)  # let the previous repetition's tail (last completions, long-polls) settle
        before = self.snapshot()
        run_ids = self.start_runs(wid, runs)
        rows = self.wait_runs(run_ids, timeout=max(120.0, total / 10))
        m = self.measured(before, total)
        span = (max(r["finished_at"] for r in rows) - min(r["started_at"] for r in rows)).total_seconds()
        m["span_s"] = span
        m["tasks_per_s"] = total / span if span > 0 else 0.0
        m["submit_to_start_ms"] = statistics.median(
            (r["started_at"] - r["created_at"]).total_seconds() * 1000 for r in rows
        )
        m["run_ids"] = run_ids
        log.info("  %s, repetition %s: %.0f tasks/s (%d tasks in %.2fs)", label, which, m["tasks_per_s"], total, span)
        return m

    def summary(self, label: str, reps: list[dict[str, Any]], runs: int, tasks_per_run: int) -> dict[str, Any]:
        """The repetitions of a throughput scenario summed up; its invariants checked (and its profile)."""
        summary = summarize(label, reps, runs, tasks_per_run)
        if self.profile:
            summary["profile"] = self.top_statements(runs * tasks_per_run * len(reps))
        summary["invariants"] = self.invariants(label)
        return summary

    def top_statements(self, tasks: int, limit: int = 12) -> list[dict[str, Any]]:
        """The statements that took the most time since the last reset (pg_stat_statements, track = all)."""
        rows = self.conn.execute(
            "SELECT toplevel, calls, total_exec_time, mean_exec_time, rows,"
            " left(regexp_replace(query, '\\s+', ' ', 'g'), 110)"
            " FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"
            " ORDER BY total_exec_time DESC LIMIT %s",
            [limit],
        ).fetchall()
        keys = ("toplevel", "calls", "total_ms", "mean_ms", "rows", "query")
        return [dict(zip(keys, r, strict=True)) | {"ms_per_task": r[2] / tasks} for r in rows]

    def idle_claims(self, samples: int) -> dict[str, list[Any]]:
        """``samples`` 1-task runs, one at a time, 0.2 s apart (idle: every worker back in its long-poll): for each,
        ms from the run's creation to its dispatch, to its claim (attempt started) and to its end (database
        clock); and the run ids."""
        wid = self.workflow("bench-latency", 1, 1)
        out: dict[str, list[Any]] = {"dispatch_ms": [], "claim_ms": [], "finish_ms": [], "run_ids": []}
        for _ in range(samples):
            time.sleep(0.2)
            (run_id,) = self.start_runs(wid)
            (row,) = self.wait_runs([run_id], timeout=30, poll=0.01)
            dispatched, started = one(
                self.conn,
                "SELECT d.created_at, a.started_at FROM awp.attempts a JOIN awp.dispatches d USING (dispatch_id)"
                " WHERE a.run_id = %s AND a.attempt = 1",
                [run_id],
            )
            out["dispatch_ms"].append((dispatched - row["created_at"]).total_seconds() * 1000)
            out["claim_ms"].append((started - row["created_at"]).total_seconds() * 1000)
            out["finish_ms"].append((row["finished_at"] - row["created_at"]).total_seconds() * 1000)
            out["run_ids"].append(run_id)
        return out

    def latency(self, samples: int) -> dict[str, Any]:
        before = self.snapshot()
        claims = self.idle_claims(samples)
        dispatch_ms, claim_ms, finish_ms = claims["dispatch_ms"], claims["claim_ms"], claims["finish_ms"]
        m = self.measured(before, samples)
        log.info(
            "  idle latency: dispatch p50 %.1f ms, claim p50 %.1f ms, finish p50 %.1f ms",
            statistics.median(dispatch_ms),
            statistics.median(claim_ms),
            statistics.median(finish_ms),
        )
        label = f"idle, 1-task run, {len(self.pool.workers)} workers long-polling"
        return {
            "label": label,
            "invariants": self.invariants("idle latency"),
            "samples": samples,
            "dispatch_ms": percentiles(dispatch_ms, (0.5, 0.95)) | {"values": dispatch_ms},
            "claim_ms": percentiles(claim_ms, (0.5, 0.95)) | {"values": claim_ms},
            "finish_ms": percentiles(finish_ms, (0.5, 0.95)) | {"values": finish_ms},
            "claims": m["claims"],
            "coordinator": m["coordinator"],
        }

    def io_bound(self, plan: Plan) -> dict[str, Any]:
        """Issue 18: an I/O-bound run (LLM calls, say) on the default settings: ``io_tasks`` mock tasks of
        ``io_sleep_ms`` on ``io_workers`` x ``io_concurrency`` slots, run concurrency = tasks (the run does not
        cap). The ideal is io_tasks x io_sleep_ms / slots; the old default dispatch_limit (100) took twice that
        on 200 slots. Also the peak number of attempts at once and what held the waiting tasks (sampled)."""
        slots = plan.io_workers * plan.io_concurrency
        ideal_s = plan.io_tasks * plan.io_sleep_ms / 1000 / slots
        self.pool.resize(0)
        self.pool.resize(plan.io_workers, plan.io_concurrency)
        wid = self.workflow(
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
            (run_id,) = self.start_runs(wid)
            reasons: Counter[str] = Counter()
            deadline = time.monotonic() + max(120.0, 10 * ideal_s)
            while time.monotonic() < deadline:
                rows = self.conn.execute(
                    "SELECT reason, count(*) FROM awp.run_waits(%s) GROUP BY 1", [run_id]
                ).fetchall()
                for reason, n in rows:
                    reasons[reason] = max(reasons[reason], n)  # the most tasks held for each reason at once
                if not rows:
                    break
                time.sleep(0.5)
            (row,) = self.wait_runs([run_id], timeout=max(120.0, 10 * ideal_s))
            span = (row["finished_at"] - row["started_at"]).total_seconds()
            peak = one(
                self.conn,
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
            "dispatch_limit": one(self.conn, "SELECT awp.get_settings()->>'dispatch_limit'")[0],
            "ideal_s": ideal_s,
            "span_s": median_spread(spans),
            "ratio_to_ideal": statistics.median(spans) / ideal_s if spans else None,
            "peak_concurrency": max(r["peak_concurrency"] for r in reps) if reps else None,
            "repetitions": reps,
            "invariants": self.invariants("I/O-bound"),
        }

    def recovery(self, label: str, lease_ms: int, heartbeat_ms: int, repeats: int) -> dict[str, Any]:
        """kill -9 the worker holding a lease; time until attempt 2 is claimed (all database clock)."""
        self.configure(lease_ms, heartbeat_ms)
        self.pool.resize(0)
        self.pool.resize(2, 1)  # new sessions take the new heartbeat interval
        wid = self.workflow(
            "bench-recovery",
            1,
            1,
            {"input": {"sleep_ms": 3_600_000}, "retry": {"max_attempts": 2, "interval_ms": 0}},
        )
        samples = []
        for i in range(repeats):
            (run_id,) = self.start_runs(wid)
            first = wait_for(
                lambda rid=run_id: self.conn.execute(
                    "SELECT worker_id FROM awp.attempts WHERE run_id = %s AND attempt = 1", [rid]
                ).fetchone(),
                30,
                "attempt 1",
            )
            victim = self.pool.by_worker_id(first[0])
            if victim is None:
                raise RuntimeError(f"attempt 1 is held by an unknown worker {first[0]}")
            time.sleep(random.uniform(0, heartbeat_ms / 1000))  # kill at a random point of the heartbeat cycle
            (killed_at,) = one(self.conn, "SELECT clock_timestamp()")
            self.pool.kill9(victim)
            second = wait_for(
                lambda rid=run_id: self.conn.execute(
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
            self.conn.execute("SELECT awp.request_cancel(%s)", [run_id])
            wait_for(
                lambda rid=run_id: self.conn.execute(
                    "SELECT 1 FROM awp.runs WHERE run_id = %s AND finished_at IS NOT NULL", [rid]
                ).fetchone(),
                30,
                "the canceled run to finish",
            )
            self.pool.resize(2, 1)
        self.pool.resize(0)
        self.configure(DEFAULT_LEASE_MS, DEFAULT_HEARTBEAT_MS)
        return {
            "label": label,
            "invariants": self.invariants(f"recovery ({label} lease)"),
            "lease_ms": lease_ms,
            "heartbeat_ms": heartbeat_ms,
            "takeover_ms": median_spread([s["takeover_ms"] for s in samples]),
            "detected_ms": median_spread([s["detected_ms"] for s in samples]),
            "samples": samples,
        }


def wait_for(probe: Any, timeout: float, what: str, poll: float = 0.01) -> Any:
    """Poll every 10 ms by default: these waits time a takeover."""
    return awp_procs.wait_for(probe, timeout, what, poll)


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


def problems(results: dict[str, Any]) -> list[str]:
    """What makes the benchmark's exit status 1: a failed peer, a violated invariant."""
    out = []
    peer = results.get("peer") or {}
    if peer.get("status") == "failed":
        out.append(f"peer {peer.get('name')}: {peer.get('error')}")
    scenarios = [
        *results.get("throughput", []),
        *([results["latency"]] if results.get("latency") else []),
        *([results["io_bound"]] if results.get("io_bound") else []),
        *results.get("recovery", []),
        *(results.get("many_runs") or {}).values(),
        *(v for k, v in (results.get("dynamic") or {}).items() if k in ("static", "for_each")),
        *(results.get("pacing") or {}).values(),
        *(s[k] for s in (results.get("progress") or {}).get("shapes", []) for k in ("none", "logs")),
    ]
    for s in scenarios:
        if s.get("status") == "failed":
            out.append(f"{s['label']}: FAILED: {s.get('error')}")
        inv = s.get("invariants") or {}
        if inv.get("violations"):
            out.append(
                f"{s['label']}: awp.check_invariants() returned {inv['violations']} row(s) {inv['by_invariant']}"
            )
    return out


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
    }
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu_model"] = line.split(":", 1)[1].strip()
                break
    with contextlib.suppress(OSError):
        load = Path("/proc/loadavg").read_text().split()[:3]
        info["loadavg_at_start"] = [float(x) for x in load]
    return info


def postgres_settings(conn: psycopg.Connection[Any]) -> dict[str, Any]:
    return {
        name: one(conn, f"SHOW {name}")[0]
        for name in ("server_version", "fsync", "synchronous_commit", "shared_buffers", "max_connections")
    }


def enable_pg_stat_statements(server: Any) -> None:
    """Restart the throwaway cluster with pg_stat_statements tracking nested statements (``--profile``)."""
    with psycopg.connect(server.admin_dsn(), autocommit=True) as c:
        c.execute("ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'")
    server.stop(mode="fast")
    server.start(fsync=True)
    with psycopg.connect(server.admin_dsn(), autocommit=True) as c:  # known only once the library is loaded
        c.execute("ALTER SYSTEM SET pg_stat_statements.track = 'all'")
        c.execute("SELECT pg_reload_conf()")


def run_plan(
    plan: Plan,
    dsn: str,
    datadir: Path | None,
    workdir: Path,
    reaper: Reaper,
    profile: bool = False,
    peer_dsn: str | None = None,
    ref_dsn: str | None = None,
) -> dict[str, Any]:
    started = time.monotonic()
    ref_dsn = ref_dsn or dsn
    b = Bench(dsn, datadir, workdir, reaper, profile)
    if profile:
        b.conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
    results: dict[str, Any] = {"plan": asdict(plan), "machine": machine(), "profiled": profile}
    results["postgres"] = postgres_settings(b.conn)
    results["settings"] = {
        "lease_duration_ms": DEFAULT_LEASE_MS,
        "heartbeat_interval_ms": DEFAULT_HEARTBEAT_MS,
        "dispatch_limit": 10000,
        "coordinator_interval_ms": b.gateway.coordinator_interval_ms,
        "claim_recheck_ms": 500,
        "gateway_pool_size": 10,
        "worker_wait_ms": 20000,
        "worker_concurrency": 1,
    }
    # The defaults are those of a fresh database: say so from the database itself.
    results["settings_in_db"] = one(b.conn, "SELECT awp.configure()")[0]
    for key in ("lease_duration_ms", "heartbeat_interval_ms", "dispatch_limit"):
        results["settings"][key] = results["settings_in_db"].get(key, results["settings"][key])

    log.info(
        "reference: pgbench SKIP LOCKED claim + complete, %s clients, %ss each", plan.ref_clients, plan.ref_seconds
    )
    ref = {}
    for clients in plan.ref_clients:
        reps = [reference.run_pgbench(ref_dsn, clients, plan.ref_seconds, plan.ref_rows) for _ in range(plan.repeats)]
        ref[str(clients)] = median_spread([r["tasks_per_s"] for r in reps]) | {"runs": reps}
        log.info("  %d client(s): %.0f jobs/s", clients, ref[str(clients)]["median"])
    reference.drop(ref_dsn)
    results["reference"] = ref

    b.gateway.start()
    log.info("awp serve on %s; workers: real `awp worker` processes", b.gateway.base_url)
    throughput = []
    try:
        # Side by side with the peer, repetitions alternating (docstring, step 2). AWP's workers are stopped during
        # the peer's repetitions, so PostgreSQL's CPU in the peer's window is the peer's, but for the idle
        # gateway's coordinator passes (once a second).
        n_side, slots = plan.peer_workers, plan.peer_workers * plan.peer_concurrency
        side_label = f"1 run x {plan.single_tasks} tasks, {n_side} workers"
        side_wid = b.workflow(f"bench-single-{plan.single_tasks}-c{slots}", plan.single_tasks, slots)
        warm_wid = b.workflow(f"bench-warm-up-c{slots}", WARM_UP_TASKS, slots)
        b.pool.resize(n_side, plan.peer_concurrency)
        b.repetition("warm-up (not measured)", warm_wid, 1, WARM_UP_TASKS, "1/1")
        side_reps: list[dict[str, Any]] = []

        def awp_beside(i: int) -> None:
            b.pool.resize(n_side, plan.peer_concurrency)
            which = f"{i + 1}/{plan.side_repeats}"
            side_reps.append(b.repetition(side_label, side_wid, 1, plan.single_tasks, which))
            b.pool.resize(0)

        b.pool.resize(0)
        if b.profile:
            b.conn.execute("SELECT pg_stat_statements_reset()")
        results["peer"] = measure_peer(plan, peer_dsn, datadir, workdir, reaper, awp_beside)
        while len(side_reps) < plan.side_repeats:  # the peer was not measured (or failed): AWP's repetitions alone
            awp_beside(len(side_reps))
        side = b.summary(side_label, side_reps, 1, plan.single_tasks) | {"workers": n_side, "beside_peer": True}
        for n in plan.single_workers:
            if n == n_side and plan.peer_concurrency == 1:
                throughput.append(side)
                continue
            wid = b.workflow(f"bench-single-{plan.single_tasks}-c{n}", plan.single_tasks, n)
            label = f"1 run x {plan.single_tasks} tasks, {n} worker{'s' if n > 1 else ''}"
            if n > n_side and plan.peer_concurrency == 1:  # target (2): against n_side workers, alternating
                against = (side_label, side_wid, n_side)
                throughput.append(b.throughput_against(label, wid, n, plan.single_tasks, plan.repeats, against))
                continue
            b.pool.resize(n, 1)
            throughput.append(b.throughput(label, wid, 1, plan.single_tasks, plan.repeats) | {"workers": n})
        for n in plan.multi_workers:
            b.pool.resize(n, 1)
            wid = b.workflow(f"bench-multi-{plan.multi_tasks}-c{n}", plan.multi_tasks, n)
            label = f"{plan.multi_runs} runs x {plan.multi_tasks} tasks, {n} workers"
            throughput.append(
                b.throughput(label, wid, plan.multi_runs, plan.multi_tasks, plan.repeats) | {"workers": n}
            )
        results["latency"] = b.latency(plan.latency_samples)
        slots = plan.batch_workers * plan.batch_concurrency
        batch_tasks = plan.batch_tasks
        if plan.name == "quick":  # about 8 s of work at the rate of 4 workers, in whole rounds of the slots
            rate4 = next((t["tasks_per_s"]["median"] for t in throughput if t["workers"] == 4), 100.0)
            batch_tasks = max(5 * slots, min(plan.batch_tasks, round(8 * rate4 / slots) * slots))
        b.pool.resize(plan.batch_workers, plan.batch_concurrency)
        wid = b.workflow(f"bench-batch-{batch_tasks}-c{slots}", batch_tasks, slots)
        label = f"1 run x {batch_tasks} tasks, {plan.batch_workers} workers x concurrency {plan.batch_concurrency}"
        throughput.append(
            b.throughput(label, wid, 1, batch_tasks, plan.batch_repeats)
            | {"workers": plan.batch_workers, "worker_concurrency": plan.batch_concurrency}
        )
        results["throughput"] = throughput
        results["io_bound"] = b.io_bound(plan)
        results["recovery"] = [b.recovery(lbl, lease, hb, plan.repeats) for lbl, lease, hb in plan.recovery]
        sizes = (100, 100_000) if plan.name == "full" else (100, 20_000)
        log.info("retention: /metrics with %s finished runs; one prune batch; pruning them all", sizes)
        results["retention"] = retention.measure(dsn, b.gateway.base_url, sizes)
        for line in retention.lines(results["retention"]):
            log.info(line)
        # Issue 46 last: after retention's prune the database is small again, and its runs (tens of thousands)
        # weigh on no earlier scenario's whole-database awp.check_invariants().
        results["many_runs"] = many_runs.measure(b, plan)
        results["dynamic"] = dynamic.measure(b, plan)
        results["pacing"] = pacing.measure(b, plan)
        results["progress"] = progress_cost.measure(b, plan)
        log.info("%s", progress_cost.table(results["progress"]))
    finally:
        b.pool.resize(0)
        b.gateway.stop()
        b.conn.close()
    results["elapsed_s"] = time.monotonic() - started
    return results


def run_io_only(
    plan: Plan, dsn: str, datadir: Path | None, workdir: Path, reaper: Reaper, out: Path, when: dt.datetime
) -> int:
    """``--io-only``: the I/O-bound scenario alone, on its own gateway and workers; prints the table and writes
    ``io-<time>.json`` (``latest.*`` are left as they are)."""
    b = Bench(dsn, datadir, workdir, reaper)
    b.gateway.start()
    try:
        io = b.io_bound(plan)
    finally:
        b.pool.resize(0)
        b.gateway.stop()
        b.conn.close()
    print(report.io_table(io).text())
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
    b = Bench(dsn, datadir, workdir, reaper)
    results: dict[str, Any] = {"plan": asdict(plan), "machine": machine(), "postgres": postgres_settings(b.conn)}
    b.gateway.start()
    log.info("awp serve on %s; workers: real `awp worker` processes", b.gateway.base_url)
    try:
        results["many_runs"] = many_runs.measure(b, plan)
    finally:
        b.pool.resize(0)
        b.gateway.stop()
        b.conn.close()
    results["elapsed_s"] = time.monotonic() - started
    results["started_at"] = when.isoformat(timespec="seconds")
    results["problems"] = problems(results)
    results["targets"] = [{"target": a, "measured": m, "met": c} for a, m, c in report.many_runs_targets(results)]
    print()
    print(report.many_runs_text(results))
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"many-{plan.name}-{when.strftime('%Y%m%dT%H%M%SZ')}.json"
    path.write_text(json.dumps(results, indent=2, default=str) + "\n")
    log.info("written %s", path)
    for p in results["problems"]:
        log.error("PROBLEM: %s", p)
    return 1 if results["problems"] else 0


def measure_alone(
    plan: Plan,
    dsn: str,
    datadir: Path | None,
    workdir: Path,
    reaper: Reaper,
    key: str,
    measure: Callable[[Bench, Plan], dict[str, Any]],
) -> dict[str, Any]:
    """One step alone (``--dynamic-only``, ``--pacing-only``, ``--progress-only``) on its own gateway and workers:
    {"plan", "machine", key: what ``measure`` returned}."""
    b = Bench(dsn, datadir, workdir, reaper)
    results: dict[str, Any] = {"plan": asdict(plan), "machine": machine()}
    b.gateway.start()
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
        "dynamic": (dynamic, report.dynamic_table, report.dynamic_targets),
        "pacing": (pacing, report.pacing_table, report.pacing_targets),
    }[step]
    results = measure_alone(plan, dsn, datadir, workdir, reaper, step, module.measure)
    results["started_at"] = when.isoformat(timespec="seconds")
    results["problems"] = problems(results)
    print(table(results).text())
    for name, measured, met in targets(results):
        print(f"{name}: {measured} {'NOT MEASURED' if met is None else ('PASS' if met else 'MISS')}")
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{step}-{plan.name}-{when.strftime('%Y%m%dT%H%M%SZ')}.json"
    path.write_text(json.dumps(results, indent=2, default=str) + "\n")
    log.info("written %s", path)
    for p in results["problems"]:
        log.error("PROBLEM: %s", p)
    return 1 if results["problems"] else 0


def run_progress_only(
    plan: Plan, dsn: str, datadir: Path | None, workdir: Path, reaper: Reaper, out: Path, when: dt.datetime
) -> int:
    """``--progress-only``: step 12 alone (``progress_cost.py``), on its own gateway and workers; prints its table and
    writes ``progress-<plan>-<time>.json`` (``latest.*`` are left as they are)."""
    results = measure_alone(plan, dsn, datadir, workdir, reaper, "progress", progress_cost.measure)
    results["started_at"] = when.isoformat(timespec="seconds")
    print(progress_cost.table(results["progress"]))
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"progress-{plan.name}-{when.strftime('%Y%m%dT%H%M%SZ')}.json"
    path.write_text(json.dumps(results, indent=2, default=str) + "\n")
    log.info("written %s", path)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="reduced sizes (about three minutes)")
    parser.add_argument("--repeats", type=int, help="override the repetitions of every figure")
    parser.add_argument("--out", type=Path, default=RESULTS, help="results directory [%(default)s]")
    parser.add_argument("--keep-logs", action="store_true", help="keep the gateway and worker logs")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="load pg_stat_statements (track = all) and print the top statements of each throughput scenario",
    )
    parser.add_argument(
        "--io-only",
        action="store_true",
        help="only the I/O-bound scenario (issue 18; with --quick: 1,000 tasks), printed and written to io-<time>.json",
    )
    parser.add_argument(
        "--many-runs-only",
        action="store_true",
        help="only the scenarios of issue 46 (many_runs.py; with --quick: reduced sizes), printed with their targets "
        "and written to many-<plan>-<time>.json",
    )
    parser.add_argument(
        "--dynamic-only",
        action="store_true",
        help="only step 10 (issue 39, dynamic.py: for_each against a static run), printed with its target and "
        "written to dynamic-<plan>-<time>.json",
    )
    parser.add_argument(
        "--pacing-only",
        action="store_true",
        help="only step 11 (issue 40, pacing.py: max_in_flight and per_window under load), printed with its "
        "targets and written to pacing-<plan>-<time>.json",
    )
    parser.add_argument(
        "--progress-only",
        action="store_true",
        help="only step 12 (issue 45, progress_cost.py: tasks logging 10 lines against none), printed with its "
        "target and written to progress-<plan>-<time>.json",
    )
    args = parser.parse_args()
    if args.io_only + args.many_runs_only + args.dynamic_only + args.pacing_only + args.progress_only > 1:
        parser.error("--io-only, --many-runs-only, --dynamic-only, --pacing-only and --progress-only: one at a time")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    plan = QUICK if args.quick else FULL
    if args.repeats:
        plan = replace(
            plan,
            repeats=args.repeats,
            side_repeats=args.repeats,
            many_repeats=args.repeats,
            backlog_repeats=args.repeats,
            log_pairs=max(1, (args.repeats + 1) // 2),
        )

    def interrupted(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    # Explicit handlers: a shell's background job inherits SIGINT ignored, and SIGTERM must clean up too.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, interrupted)
    when = dt.datetime.now(dt.UTC)
    workdir = Path(tempfile.mkdtemp(prefix="awp-bench-"))
    reaper = Reaper()
    ok = interrupted_run = False
    try:
        with throwaway_cluster(fsync=True) as server:
            datadir = getattr(server, "datadir", None)
            if args.profile:
                if datadir is None:
                    parser.error("--profile needs the throwaway cluster (unset AWP_TEST_DSN)")
                enable_pg_stat_statements(server)
            dsn = fresh_database(server, database_name("bench"))
            peer_db = database_name("bench_procrastinate")
            alone = args.io_only or args.many_runs_only or args.dynamic_only or args.pacing_only or args.progress_only
            # empty: the peer applies its own schema (not needed for --io-only, --many-runs-only, --dynamic-only)
            peer_dsn = None if alone else server.create_database(peer_db)
            # The plain-SQL reference runs in a database of its own: run in AWP's database, its 300,000-row
            # table churn (and the VACUUM ANALYZE after it) slowed AWP's later scenarios by 30-150%.
            ref_db = database_name("bench_reference")
            ref_dsn = None if alone else server.create_database(ref_db)
            try:
                if args.io_only:
                    alone_code = run_io_only(plan, dsn, datadir, workdir, reaper, args.out, when)
                elif args.many_runs_only:
                    alone_code = run_many_only(plan, dsn, datadir, workdir, reaper, args.out, when)
                elif args.dynamic_only or args.pacing_only:
                    step = "dynamic" if args.dynamic_only else "pacing"
                    alone_code = run_step_only(step, plan, dsn, datadir, workdir, reaper, args.out, when)
                elif args.progress_only:
                    alone_code = run_progress_only(plan, dsn, datadir, workdir, reaper, args.out, when)
                else:
                    results = run_plan(plan, dsn, datadir, workdir, reaper, args.profile, peer_dsn, ref_dsn)
            finally:
                with contextlib.suppress(Exception):
                    server.drop_database(peer_db)
                with contextlib.suppress(Exception):
                    server.drop_database(ref_db)
        ok = True
    except KeyboardInterrupt:
        log.error("interrupted: stopping every process the benchmark started")
        interrupted_run = True
        return 130
    finally:
        reaper.kill_all()
        if (ok or interrupted_run) and not args.keep_logs:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            log.info("gateway and worker logs kept in %s", workdir)
    if alone:
        return alone_code
    results["started_at"] = when.isoformat(timespec="seconds")
    results["problems"] = problems(results)
    report.write(results, args.out, when)
    for p in results["problems"]:
        log.error("PROBLEM: %s", p)
    return 1 if results["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
