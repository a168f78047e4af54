"""A/B comparisons that this machine's drift cannot fake: the variants are measured in turns, round after round,
in one throwaway cluster (fsync on), and compared round by round.

    .venv/bin/python benchmarks/ab.py sql  HEAD~1 .            # backend CPU per completion, straight over SQL
    .venv/bin/python benchmarks/ab.py http . .:AWP_X=1         # tasks/s and CPU per task through HTTP

A variant is ``SOURCE[:NAME=VALUE,...]``: SOURCE is a checkout (a directory holding ``db/``; ``.`` is the working
tree) or a git revision (its ``db/`` and ``python/`` exported with ``git archive``); the NAME=VALUE pairs are
environment variables of that variant's ``awp serve``, but for ``AB_LOGS=N``: each completion carries N log lines
(``sql``: as a task's last lines ride on its result; ``http``: mock tasks that each log N lines), and ``AB_RANGES=N``
(``sql``: N more time ranges of history, empty, before today's: partitions the hot path's plans cover). Each variant
gets a database of its own, migrated from its SQL; its ``awp serve`` runs its ``python/awp`` (first on PYTHONPATH);
every worker runs the working tree's.

``sql``: one worker of one slot completes every task of ``--runs`` runs of ``--tasks`` tasks (``--runs`` > 1: each
refill goes to another run) with ``awp.complete_and_claim``; measured: the backend's CPU (``/proc``) per completion.
``--group K``: K workers of one slot complete one run's tasks, their K completions sent together each time (one
``awp.complete_and_claim_many`` call, the group path: what the gateway sends when a run's calls queue up).
``http``: ``--runs`` runs of ``--tasks`` mock tasks on ``--workers`` real ``awp worker`` processes of
``--concurrency`` slots, through that variant's ``awp serve``; measured as ``make bench`` does (tasks/s from the
database clock, CPU per task of PostgreSQL and the workers, gateway CPU per request). ``--pre N`` first runs N
tasks in every database, so that the tables are not small (plans change with table size).

The table gives each variant's median and its ratio to the first variant per round: a change is real when the
ratios agree, not when two medians differ (this machine drifts by 20% from minute to minute and by up to 4 x
between phases).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from awp_testing.cluster import database_name, fresh_database, one, throwaway_cluster

REPO = Path(__file__).resolve().parent.parent
SUCCESS = json.dumps({"kind": "success"})


@dataclass
class Variant:
    spec: str
    sql_dir: Path
    env: dict[str, str] = field(default_factory=dict)
    samples: list[dict[str, float]] = field(default_factory=list)


def variant(spec: str, workdir: Path) -> Variant:
    """``SOURCE[:NAME=VALUE,...]`` -> its SQL directory and its gateway's environment (a git revision is exported
    first; its ``python/`` goes first on the gateway's PYTHONPATH)."""
    source, _, env_text = spec.partition(":")
    env = dict(pair.split("=", 1) for pair in env_text.split(",") if pair)
    path = Path(source or ".")
    if not (path / "db").is_dir():
        path = Path(tempfile.mkdtemp(prefix="ab-", dir=workdir))
        archive = subprocess.run(
            ["git", "-C", str(REPO), "archive", source, "db", "python"], check=True, capture_output=True
        )
        subprocess.run(["tar", "-x", "-C", str(path)], input=archive.stdout, check=True)
    if (path / "python" / "awp").is_dir() and path.resolve() != REPO:
        env.setdefault("PYTHONPATH", str((path / "python").resolve()))
    return Variant(spec, (path / "db").resolve(), env)


# ---- sql: backend CPU per completion ------------------------------------------------------------------------------


def backend_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def define(
    conn: psycopg.Connection[Any], wid: str, tasks: int, concurrency: int = 1, timeout_ms: int | None = None
) -> None:
    timeout = {} if timeout_ms is None else {"timeout_ms": timeout_ms}
    definition = {
        "id": wid,
        "concurrency": concurrency,
        "tasks": [{"key": f"t{i:05d}", "executor": "mock", **timeout} for i in range(tasks)],
    }
    conn.execute("SELECT * FROM awp.create_workflow_version(%s)", [json.dumps(definition)])


def live_output(logs: int) -> list[dict[str, Any]]:
    """A completion's ``live_output``: one write of ``logs`` log lines (docs/progress.md)."""
    return [{"logs": [f"log line {i} of the task" for i in range(logs)], "offset": 0}]


def complete_all(conn: psycopg.Connection[Any], wid: str, runs: int, logs: int = 0) -> int:
    """Start ``runs`` runs of ``wid`` and complete all their tasks as one new worker of one slot (claim on
    complete), each completion carrying ``logs`` log lines when not 0 (its ``live_output``, as a worker sends a
    task's last lines); returns the number of completions."""
    live = [json.dumps(live_output(logs))] if logs else []
    call = "awp.complete_and_claim(%s, %s, %s, %s, %s, 1, %s" + (", %s)" if logs else ")")
    worker, token = one(conn, "SELECT worker_id, session_token FROM awp.register_worker('ab', '{mock}', 1)")
    with conn.transaction():
        for _ in range(runs):
            conn.execute("SELECT awp.start_run(%s)", [wid])
    seq, done = 1, 0
    lease = conn.execute(
        "SELECT dispatch_id, lease_token FROM awp.claim_tasks(%s, %s, 1, 1)", [worker, token]
    ).fetchone()
    while lease is not None:
        seq += 1
        lease = conn.execute(
            f"SELECT dispatch_id, lease_token FROM {call}", [worker, token, lease[0], lease[1], SUCCESS, seq, *live]
        ).fetchone()
        done += 1
        if lease is None:  # no refill (the last tasks, or a coordinator pass between): claim what is left
            seq += 1
            lease = conn.execute(
                "SELECT dispatch_id, lease_token FROM awp.claim_tasks(%s, %s, 1, %s)", [worker, token, seq]
            ).fetchone()
    conn.execute("SELECT awp.drain_worker(%s, %s)", [worker, token])  # stopped: it holds no lease
    return done


def complete_grouped(conn: psycopg.Connection[Any], wid: str, workers: int, logs: int = 0) -> int:
    """Start one run of ``wid`` and complete all its tasks as ``workers`` new workers of one slot each, their
    completions sent together, one ``awp.complete_and_claim_many`` call each time (as the gateway groups one run's
    calls), each item carrying ``logs`` log lines when not 0; returns the number of completions."""
    sql = "SELECT worker_id, session_token FROM awp.register_worker('ab', '{mock}', 1)"
    ids = [one(conn, sql) for _ in range(workers)]
    conn.execute("SELECT awp.start_run(%s)", [wid])
    seq, done = 1, 0
    held: dict[int, tuple[str, str]] = {}
    while True:
        for i, (worker, token) in enumerate(ids):
            if i not in held:
                seq += 1
                row = conn.execute(
                    "SELECT dispatch_id, lease_token FROM awp.claim_tasks(%s, %s, 1, %s)", [worker, token, seq]
                ).fetchone()
                if row is not None:
                    held[i] = row
        if not held:
            break
        order = sorted(held)
        items = []
        for i in order:
            seq += 1
            worker, token = ids[i]
            dispatch_id, lease_token = held[i]
            items.append(
                {
                    "worker_id": worker,
                    "session_token": token,
                    "dispatch_id": dispatch_id,
                    "lease_token": lease_token,
                    "result": {"kind": "success"},
                    "slots": 1,
                    "claim_seq": seq,
                    **({"live_output": live_output(logs)} if logs else {}),
                }
            )
        rows = conn.execute(
            "SELECT g.item, g.error, (g.lease).dispatch_id, (g.lease).lease_token"
            " FROM awp.complete_and_claim_many(%s) g",
            [json.dumps(items)],
        ).fetchall()
        done += len(items)
        held = {}
        for item, error, dispatch_id, lease_token in rows:
            if error is not None:
                raise SystemExit(f"complete_and_claim_many refused an item: {error}")
            if dispatch_id is not None:
                held[order[item - 1]] = (dispatch_id, lease_token)
    for worker, token in ids:
        conn.execute("SELECT awp.drain_worker(%s, %s)", [worker, token])
    return done


def past_ranges(conn: psycopg.Connection[Any], n: int) -> None:
    """``AB_RANGES=N``: N more (empty) time ranges of history before today's (a day each), as retention keeps them
    (db/functions/_partitions.sql): the number of partitions the hot path's plans cover."""
    conn.execute("SET ROLE awp_owner")  # the owner of AWP's tables owns their partitions
    for k in range(1, n + 1):
        conn.execute(
            "SELECT awp._make_history_partition(t.tab, t.prefix, h.lo, h.lo + 86400000, h.suffix)"
            " FROM awp._history_tables() t,"
            " (SELECT min(lower_ms) - 86400000 * %s AS lo, 'past' || %s AS suffix FROM awp.history_partitions) h",
            (k, k),
        )
    if n:
        conn.execute(
            "INSERT INTO awp.history_partitions (lower_ms, upper_ms, suffix, created_at)"
            " SELECT m - 86400000 * k, m - 86400000 * (k - 1), 'past' || k, now()"
            " FROM (SELECT min(lower_ms) AS m FROM awp.history_partitions) x, generate_series(1, %s) k",
            (n,),
        )
    conn.execute("RESET ROLE")


def run_sql(args: argparse.Namespace, variants: list[Variant]) -> None:
    def complete(conn: psycopg.Connection[Any], v: Variant) -> int:  # a round's work: every task of the "ab" workflow
        if args.group:
            return complete_grouped(conn, "ab", args.group, int(v.env.get("AB_LOGS", 0)))
        return complete_all(conn, "ab", args.runs, int(v.env.get("AB_LOGS", 0)))

    with throwaway_cluster(fsync=True) as server:
        conns = []
        for i, v in enumerate(variants):
            conn = psycopg.connect(fresh_database(server, database_name(f"ab{i}"), sql_dir=v.sql_dir), autocommit=True)
            conn.prepare_threshold = 0
            past_ranges(conn, int(v.env.get("AB_RANGES", 0)))
            define(conn, "ab", args.tasks, max(1, args.group))
            if args.pre:
                define(conn, "ab-pre", args.pre)
                complete_all(conn, "ab-pre", 1)
            complete(conn, v)  # warm-up: plans cached, caches filled
            conns.append(conn)
        for r in range(args.rounds):
            for i in turns(len(variants), r):
                pid = conns[i].info.backend_pid
                before = backend_cpu_s(pid)
                n = complete(conns[i], variants[i])
                variants[i].samples.append({"backend ms/completion": (backend_cpu_s(pid) - before) * 1000 / n})
            report_round(r, variants, "backend ms/completion")
        for conn in conns:
            conn.close()


# ---- http: make bench's measurements, variants in turns -----------------------------------------------------------


def run_http(args: argparse.Namespace, variants: list[Variant], workdir: Path) -> None:
    from procs import Reaper  # the bench extra (make bench installs it); the sql mode needs none of it

    reaper = Reaper()
    try:
        with throwaway_cluster(fsync=True) as server:
            benches: list[Any] = []
            try:
                measure_http(args, variants, workdir, server, reaper, benches)
            finally:  # while the cluster is up
                for b in benches:
                    b.pool.resize(0)
                    b.gateway.stop()
                    b.conn.close()
    finally:
        reaper.kill_all()


def measure_http(
    args: argparse.Namespace, variants: list[Variant], workdir: Path, server: Any, reaper: Any, benches: list[Any]
) -> None:
    from harness import Bench
    from many_load import many_repetition

    slots = args.workers * args.concurrency
    wid = f"ab-{args.tasks}-c{slots}"
    for i, v in enumerate(variants):
        dsn = fresh_database(server, database_name(f"ab{i}"), sql_dir=v.sql_dir)
        saved = dict(os.environ)
        os.environ.update(v.env)  # the gateway inherits it
        try:
            b = Bench(dsn, server.datadir, Path(tempfile.mkdtemp(prefix="gw-", dir=workdir)), reaper)
            benches.append(b)
            b.gateway.start()
        finally:
            os.environ.clear()
            os.environ.update(saved)
        logs = int(v.env.get("AB_LOGS", 0))  # mock tasks logging that many lines each (benchmarks/progress_cost.py)
        b.workflow(wid, args.tasks, slots, {"input": {"sleep_ms": 0, "logs": logs}} if logs else None)
        b.pool.resize(args.workers, args.concurrency)
        if args.pre:
            b.repetition("tables filled", b.workflow("ab-pre", args.pre, slots), 1, args.pre, "1/1")
        b.repetition("warm-up", wid, args.runs, args.tasks, "1/1")
        b.pool.resize(0)
    for r in range(args.rounds):
        for i in turns(len(variants), r):
            b = benches[i]
            b.pool.resize(args.workers, args.concurrency)
            if args.runs > 1:  # as make bench's step 9: one transaction, timed from its commit, no polling per id
                m = many_repetition(b, variants[i].spec, wid, args.runs, args.tasks, f"{r + 1}/{args.rounds}")
            else:
                m = b.repetition(variants[i].spec, wid, args.runs, args.tasks, f"{r + 1}/{args.rounds}")
            b.pool.resize(0)
            n = args.runs * args.tasks
            cpu = m["cpu_s"]
            variants[i].samples.append(
                {
                    "tasks/s": m["tasks_per_s"],
                    "PostgreSQL ms/task": cpu["postgres"] * 1000 / n,
                    "worker ms/task": cpu["workers"] * 1000 / n,
                    "gateway ms/request": cpu["gateway"] * 1000 / max(1, m["requests"]),
                }
            )
        report_round(r, variants, "tasks/s")
    for v, b in zip(variants, benches, strict=True):
        violations = b.invariants(v.spec)["violations"]
        if violations:
            raise SystemExit(f"{v.spec}: awp.check_invariants() found {violations} violation(s)")


# ---- common --------------------------------------------------------------------------------------------------------


def turns(n: int, r: int) -> list[int]:
    """The order of the variants in round r: forwards, then backwards (no variant always goes first)."""
    return list(range(n)) if r % 2 == 0 else list(reversed(range(n)))


def report_round(r: int, variants: list[Variant], key: str) -> None:
    print(f"round {r + 1}: " + "  ".join(f"{v.samples[-1][key]:.3f}" for v in variants), flush=True)


def report(variants: list[Variant]) -> None:
    base = variants[0]
    print()
    for key in base.samples[0]:
        print(f"{key}: median (per-round ratio to {base.spec!r})")
        for v in variants:
            values = [s[key] for s in v.samples]
            ratios = [s[key] / b[key] for s, b in zip(v.samples, base.samples, strict=True) if b[key]]
            print(
                f"  {v.spec:<30} {statistics.median(values):9.3f}   ratio median {statistics.median(ratios):.3f}"
                f"  ({' '.join(f'{x:.2f}' for x in ratios)})"
            )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=("sql", "http"))
    parser.add_argument("variants", nargs="+", help="SOURCE[:NAME=VALUE,...]; the first is the base")
    parser.add_argument("--runs", type=int, default=1, help="runs at once [%(default)s]")
    parser.add_argument("--tasks", type=int, help="tasks per run [sql 300, http 1000]")
    parser.add_argument("--workers", type=int, default=4, help="http: worker processes [%(default)s]")
    parser.add_argument("--concurrency", type=int, default=1, help="http: slots per worker [%(default)s]")
    parser.add_argument("--rounds", type=int, default=6, help="rounds (each measures every variant once) [%(default)s]")
    parser.add_argument(
        "--group",
        type=int,
        default=0,
        help="sql: one run, this many workers of one slot, their completions sent together (one "
        "awp.complete_and_claim_many call each time, as the gateway groups a run's calls) [%(default)s: alone]",
    )
    parser.add_argument("--pre", type=int, default=0, help="tasks run first in every database [%(default)s]")
    args = parser.parse_args()
    args.tasks = args.tasks or (300 if args.mode == "sql" else 1000)
    if args.group and (args.mode != "sql" or args.runs != 1):
        parser.error("--group: sql mode, one run")
    workdir = Path(tempfile.mkdtemp(prefix="awp-ab-"))
    variants = [variant(spec, workdir) for spec in args.variants]
    started = time.monotonic()
    if args.mode == "sql":
        run_sql(args, variants)
    else:
        run_http(args, variants, workdir)
    report(variants)
    print(f"\n{args.rounds} rounds in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
