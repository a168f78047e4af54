"""``Bench``: the cluster, the gateway and the worker pool of one benchmark run (``run.py``), with the measurement
helpers every scenario uses (runs started and awaited, a measured window, a repetition and its summary,
invariants); and what a run records about the machine and PostgreSQL."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import platform
import statistics
import time
from collections import Counter
from pathlib import Path
from typing import Any

import procs
import psycopg
from figures import median_spread, summarize
from procs import Gateway, Reaper, WorkerPool

from awp_testing.cluster import one

log = logging.getLogger("bench")


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
