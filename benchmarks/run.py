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
13. sharded (issue 43, ``sharded.py``): 1 run x 1,000 tasks and 1,000 runs x 10 through a PL/Proxy router over two
   shard clusters against one database (clusters of their own), 4 workers x 1, rounds alternating, and the router's
   cost per call; no target (one machine), the ratio is stated. ``--sharded-only`` runs just this one (about 5
   minutes; ``--quick``: 200 tasks, 100 runs x 10).

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
import logging
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

# this folder's modules (peer_procrastinate, procs, ...): a script's own folder is first on sys.path. The harness
# (Bench) is in harness.py, the plans in plans.py, steps 2, 5, 6b and 7 in scenarios.py, the --*-only modes in
# alone.py, the results' files, tables and chart in report.py
import dynamic
import many_runs
import pacing
import progress_cost
import reference
import report
import report_targets
import retention
import scenarios
import sharded
from alone import run_io_only, run_many_only, run_progress_only, run_step_only, write_alone
from figures import median_spread
from harness import Bench, enable_pg_stat_statements, machine, postgres_settings
from plans import DEFAULT_HEARTBEAT_MS, DEFAULT_LEASE_MS, FULL, QUICK, Plan
from procs import Reaper

from awp_testing.cluster import database_name, fresh_database, one, throwaway_cluster

HERE = Path(__file__).resolve().parent

log = logging.getLogger("bench")
RESULTS = HERE / "results"

WARM_UP_TASKS = 200  # AWP's untimed run before the side-by-side repetitions (fresh backends, plan caches)


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
        results["peer"] = scenarios.measure_peer(plan, peer_dsn, datadir, workdir, reaper, awp_beside)
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
        results["latency"] = scenarios.latency(b, plan.latency_samples)
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
        results["io_bound"] = scenarios.io_bound(b, plan)
        results["recovery"] = [scenarios.recovery(b, lbl, lease, hb, plan.repeats) for lbl, lease, hb in plan.recovery]
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
        # Step 13 on clusters of its own (a router, two shards, one database); this gateway stays idle meanwhile.
        results["sharded"] = sharded.measure(plan, workdir, reaper)
        for line in sharded.lines(results["sharded"]):
            log.info("%s", line)
    finally:
        b.pool.resize(0)
        b.gateway.stop()
        b.conn.close()
    results["elapsed_s"] = time.monotonic() - started
    return results


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
    parser.add_argument(
        "--sharded-only",
        action="store_true",
        help="only step 13 (issue 43, sharded.py: through a PL/Proxy router over two shards against one database), "
        "printed and written to sharded-<plan>-<time>.json",
    )
    args = parser.parse_args()
    if (
        args.io_only
        + args.many_runs_only
        + args.dynamic_only
        + args.pacing_only
        + args.progress_only
        + args.sharded_only
        > 1
    ):
        parser.error(
            "--io-only, --many-runs-only, --dynamic-only, --pacing-only, --progress-only and --sharded-only: one at a"
            " time"
        )
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
        if args.sharded_only:  # clusters of its own: none of the others
            results = sharded.measure(plan, workdir, reaper)
            print("\n".join(sharded.lines(results)))
            results["problems"] = report_targets.problems({"sharded": results})
            ok = True
            return write_alone(args.out, "sharded", plan, when, results)
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
    results["problems"] = report_targets.problems(results)
    report.write(results, args.out, when)
    for p in results["problems"]:
        log.error("PROBLEM: %s", p)
    return 1 if results["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
