"""The peer measured side by side with AWP (issue 11): procrastinate, on the same cluster, same shape.

AWP's headline scenario is "1 run x N no-op tasks, 4 ``awp worker`` processes x concurrency 1". Its peer
here is, in a separate fresh database of the same throwaway cluster (fsync on):

1. procrastinate's own schema (``procrastinate/sql/schema.sql``), applied once;
2. per repetition: the tables emptied (TRUNCATE, VACUUM ANALYZE), then N jobs of a no-op ``async`` task
   deferred up front with procrastinate's API (``configure_task(..., connection=gate).batch_defer``: one
   statement, ``procrastinate_defer_jobs_v1``), in a transaction that is held open (the gate);
3. 4 worker PROCESSES (this file run as a script: ``App.run_worker`` with ``PsycopgConnector``,
   concurrency 1, default settings: LISTEN/NOTIFY on, polling 5 s, jobs kept), started while the gate is
   closed; once all 4 are registered (``procrastinate_workers``) and LISTENing, the gate commits: every
   job becomes visible at once and its NOTIFY reaches every worker, like AWP's workers long-polling
   when a run starts. (Without the gate the first worker up would start alone while the others are
   still importing: their start-up would count against procrastinate.);
4. jobs/s from the database clock: the first ``started`` event to the last ``succeeded`` event in
   ``procrastinate_events`` (``at`` = ``now()`` of the transaction that changed the status), so process
   start-up is excluded; every job must have succeeded (else the repetition fails);
5. CPU seconds of the 4 worker processes and of every PostgreSQL process between the commit of the gate
   and the moment the harness sees the last job succeeded; then SIGTERM, and each worker must exit 0
   (procrastinate's graceful stop, which unregisters the worker).

Run as a script it is one worker (the harness starts it with ``python -c`` through :data:`WORKER_BOOT`)::

    python benchmarks/peer_procrastinate.py --dsn DSN --name peer-w1 [--concurrency 1]
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import psycopg

log = logging.getLogger("bench")

TASK_NAME = "bench_noop"
QUEUE = "default"
# The worker runs this module imported (not as __main__, where procrastinate warns about an App).
WORKER_BOOT = (
    f"import sys; sys.path.insert(0, {str(Path(__file__).resolve().parent)!r}); "
    "import peer_procrastinate; sys.exit(peer_procrastinate.worker_main())"
)
TABLES = ("procrastinate_events", "procrastinate_periodic_defers", "procrastinate_jobs", "procrastinate_workers")


def _one(conn: psycopg.Connection[Any], query: str) -> Any:
    """The row ``query`` returns (this module does not import awp: procrastinate's workers import it)."""
    row = conn.execute(query).fetchone()
    assert row is not None, f"no row from {query!r}"
    return row


def version() -> str | None:
    """procrastinate's installed version, or None when it cannot be imported."""
    try:
        import procrastinate  # noqa: F401
    except ImportError:
        return None
    try:
        return metadata.version("procrastinate")
    except metadata.PackageNotFoundError:
        return "unknown"


# ---- the worker process ---------------------------------------------------------------------------------


def make_app(dsn: str) -> Any:
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))

    @app.task(name=TASK_NAME, queue=QUEUE)
    async def bench_noop() -> None:
        return None

    return app


def worker_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="one procrastinate worker of the benchmark")
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--concurrency", type=int, default=1)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    make_app(args.dsn).run_worker(
        concurrency=args.concurrency, name=args.name, wait=True, install_signal_handlers=True, delete_jobs="never"
    )
    return 0


# ---- the harness side -----------------------------------------------------------------------------------


def apply_schema(dsn: str) -> None:
    from procrastinate.schema import SchemaManager

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(SchemaManager.get_schema())


def _reset(conn: psycopg.Connection[Any]) -> None:
    conn.execute(f"TRUNCATE {', '.join(TABLES)} RESTART IDENTITY CASCADE")
    conn.execute(f"VACUUM ANALYZE {', '.join(TABLES)}")


def _log_tail(path: Path, chars: int = 2000) -> str:
    with contextlib.suppress(OSError):
        return path.read_text(errors="replace")[-chars:]
    return ""


def _wait_ready(
    conn: psycopg.Connection[Any], workers: list[tuple[str, subprocess.Popen[bytes], Path]], timeout: float
) -> None:
    """Every worker registered in procrastinate_workers and its listener connection LISTENing."""
    deadline = time.monotonic() + timeout
    while True:
        for name, proc, log_path in workers:
            if proc.poll() is not None:
                raise RuntimeError(f"procrastinate worker {name} exited with {proc.returncode}:\n{_log_tail(log_path)}")
        registered, listening = _one(
            conn,
            "SELECT (SELECT count(*) FROM procrastinate_workers),"
            " count(*) FILTER (WHERE query ILIKE 'LISTEN %procrastinate%')"
            " FROM pg_stat_activity WHERE datname = current_database()",
        )
        if registered == len(workers) and listening >= len(workers):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"{registered} of {len(workers)} procrastinate workers registered, {listening} listening"
                f" after {timeout:.0f}s"
            )
        time.sleep(0.05)


def _stop(workers: list[tuple[str, subprocess.Popen[bytes], Path]], timeout: float = 15.0) -> dict[str, int | None]:
    """SIGTERM (procrastinate's graceful stop); SIGKILL of the group of any worker still alive after timeout."""
    for _, proc, _ in workers:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    codes: dict[str, int | None] = {}
    for name, proc, _ in workers:
        try:
            codes[name] = proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            codes[name] = None  # did not stop by itself
    return codes


def run_once(
    reaper: Any,
    dsn: str,
    workdir: Path,
    jobs: int,
    n_workers: int,
    concurrency: int,
    cpu_workers: Any,
    cpu_postgres: Any,
    rep: int,
    timeout: float,
) -> dict[str, Any]:
    """One repetition (see the module's docstring); raises when a job did not succeed or a worker misbehaved.

    ``cpu_workers(pids)`` and ``cpu_postgres()`` return CPU seconds (None when unknown)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        _reset(conn)
        gate = psycopg.connect(dsn)  # a transaction, committed once every worker is ready
        workers: list[tuple[str, subprocess.Popen[bytes], Path]] = []
        codes: dict[str, int | None] = {}
        try:
            # procrastinate's own API, in the gate's transaction (its documented external-connection use)
            logging.getLogger("procrastinate").setLevel(logging.WARNING)  # not "Deferred N jobs" in the bench log
            ids = make_app(dsn).configure_task(TASK_NAME, queue=QUEUE, connection=gate).batch_defer(*([{}] * jobs))
            if len(set(ids)) != jobs:
                raise RuntimeError(f"deferred {len(set(ids))} jobs, wanted {jobs}")
            env = {**os.environ, "PYTHONUNBUFFERED": "1"}
            for i in range(n_workers):
                name = f"peer-r{rep}-w{i + 1}"
                log_path = workdir / f"{name}.log"
                cmd = [
                    sys.executable,
                    "-c",
                    WORKER_BOOT,
                    "--dsn",
                    dsn,
                    "--name",
                    name,
                    "--concurrency",
                    str(concurrency),
                ]
                workers.append((name, reaper.spawn(cmd, env, log_path), log_path))
            _wait_ready(conn, workers, timeout=60)
            pids = [p.pid for _, p, _ in workers]
            cpu_w0, cpu_pg0 = cpu_workers(pids), cpu_postgres()
            gate.commit()
            deadline = time.monotonic() + timeout
            while True:
                done, failed = _one(
                    conn,
                    "SELECT count(*) FILTER (WHERE status = 'succeeded'),"
                    " count(*) FILTER (WHERE status NOT IN ('todo', 'doing', 'succeeded'))"
                    " FROM procrastinate_jobs",
                )
                if done + failed >= jobs:
                    break
                for name, proc, log_path in workers:
                    if proc.poll() is not None:
                        raise RuntimeError(
                            f"procrastinate worker {name} exited with {proc.returncode} during the run:\n"
                            f"{_log_tail(log_path)}"
                        )
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{done} of {jobs} procrastinate jobs succeeded after {timeout:.0f}s")
                time.sleep(0.02)
            cpu_w1, cpu_pg1 = cpu_workers(pids), cpu_postgres()
            # before the stop: unregistering a worker sets its jobs' worker_id to NULL
            per_worker = sorted(
                n
                for (n,) in conn.execute(
                    "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded' GROUP BY worker_id"
                ).fetchall()
            )
        finally:
            gate.close()  # rolls back when the gate was never committed
            codes = _stop(workers)
        by_status: dict[str, int] = dict(
            conn.execute("SELECT status::text, count(*) FROM procrastinate_jobs GROUP BY 1").fetchall()
        )
        first_started, last_succeeded, started_events, succeeded_events = _one(
            conn,
            "SELECT min(at) FILTER (WHERE type = 'started'), max(at) FILTER (WHERE type = 'succeeded'),"
            " count(*) FILTER (WHERE type = 'started'), count(*) FILTER (WHERE type = 'succeeded')"
            " FROM procrastinate_events",
        )
        still_registered = _one(conn, "SELECT count(*) FROM procrastinate_workers")[0]
    if by_status.get("succeeded", 0) != jobs or succeeded_events != jobs or started_events != jobs:
        raise RuntimeError(
            f"procrastinate: {jobs} jobs deferred, by status {by_status}, {started_events} started and"
            f" {succeeded_events} succeeded events"
        )
    unclean = {name: code for name, code in codes.items() if code != 0}
    if unclean or still_registered:
        raise RuntimeError(
            f"procrastinate workers did not stop cleanly: exit codes {unclean or codes}, "
            f"{still_registered} still registered"
        )
    span = (last_succeeded - first_started).total_seconds()
    cpu = {
        "workers": cpu_w1 - cpu_w0,
        "postgres": None if cpu_pg0 is None or cpu_pg1 is None else cpu_pg1 - cpu_pg0,
    }
    return {
        "jobs": jobs,
        "succeeded": by_status.get("succeeded", 0),
        "span_s": span,
        "tasks_per_s": jobs / span if span > 0 else 0.0,
        "cpu_s": cpu,
        "cpu_ms_per_task": {k: None if v is None else v * 1000 / jobs for k, v in cpu.items()},
        "jobs_per_worker": per_worker,
        "exit_codes": codes,
    }


if __name__ == "__main__":
    sys.exit(worker_main())
