"""Instructions a PostgreSQL backend executes per completion, counted by valgrind (callgrind): a measure of a
change to the hot path that this machine's drift cannot move (the same count whatever else the machine does,
where CPU time drifts by 20% from minute to minute and by up to 4 x between phases).

    .venv/bin/python benchmarks/instructions.py HEAD .              # 2 workers' completions per call (group path)
    .venv/bin/python benchmarks/instructions.py HEAD . --group 1    # one completion per call (the single path)
    .venv/bin/python benchmarks/instructions.py . --profile out.cg  # and keep the profile (callgrind_annotate)
    .venv/bin/python benchmarks/instructions.py HEAD:AB_LOGS=10 .:AB_LOGS=10 --batch 16   # the batch route

A variant is a checkout (a directory holding ``db/``; ``.`` is the working tree) or a git revision (its ``db/``
exported with ``git archive``), optionally followed by ``:AB_LOGS=N``: each completion then carries N log lines (its
``live_output``, as a worker sends a task's last lines; docs/progress.md).

Each gets a database of its own in one throwaway cluster, migrated from its SQL,
with one run of ``--tasks`` tasks (run concurrency = ``--group``) and ``--group`` workers of one slot holding a lease
each (``--pre N``: N tasks completed first, so that the tables are not small). Then the cluster stops, and each
database is opened by a single-user backend (``postgres --single``) under callgrind that runs ``ab_step()`` again
and again, each call its own transaction: the workers' completions sent together, one
``awp.complete_and_claim_many`` call (``--group 1``: ``awp.complete_and_claim``), each completed lease refilled,
the new leases kept in a table of the database. ``--batch N``: instead, one worker of N slots holding N leases sends
what the batch route (``POST .../completions``) sends each time: its leases' last lines by one
``awp.report_progress_many`` call (with ``AB_LOGS``), then its N results with a claim of N (``awp.complete_tasks``);
the figures are then per task. Counted twice, with ``--steps`` and with twice as many calls: the
difference per call leaves the backend's start-up out. User-space instructions only (the kernel's, such as the
WAL's write and flush, are not counted); ``ab_step``'s own reads and writes of its table are counted, the same
for every variant.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from awp.dev.localdb import Cluster, as_server_user, free_port, give_to_server_user
from awp.dev.pgbin import pg_bin
from awp_testing.cluster import database_name, fresh_database, one

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ab import Variant, complete_all, define, live_output, variant

# The step: every held lease completed in one call, each refilled; the new leases replace the old ones.
STEP_SQL = """
CREATE TABLE public.ab_leases (pos integer PRIMARY KEY, worker_id text NOT NULL, session_token text NOT NULL,
                               dispatch_id text NOT NULL, lease_token text NOT NULL);
CREATE FUNCTION public.ab_step() RETURNS void LANGUAGE plpgsql AS $$
DECLARE
  v_items jsonb;
  v_n     integer;
  r       record;
BEGIN
  SELECT jsonb_agg(jsonb_build_object('worker_id', l.worker_id, 'session_token', l.session_token,
                                      'dispatch_id', l.dispatch_id, 'lease_token', l.lease_token,
                                      'result', '{"kind": "success"}'::jsonb, 'slots', 1, 'claim_seq', NULL)
                   || jsonb_strip_nulls(jsonb_build_object('live_output', public.ab_live()))
                   ORDER BY l.pos), count(*)
    INTO v_items, v_n FROM public.ab_leases l;
  IF v_n = 1 THEN
    FOR r IN SELECT 1 AS item, c.dispatch_id, c.lease_token
               FROM public.ab_leases l,
                    awp.complete_and_claim(l.worker_id, l.session_token, l.dispatch_id, l.lease_token,
                                           '{"kind": "success"}', 1, NULL, public.ab_live()) c LOOP
      UPDATE public.ab_leases SET dispatch_id = r.dispatch_id, lease_token = r.lease_token WHERE pos = r.item;
    END LOOP;
  ELSE
    FOR r IN SELECT g.item, (g.lease).dispatch_id, (g.lease).lease_token, g.error
               FROM awp.complete_and_claim_many(v_items) g LOOP
      IF r.error IS NOT NULL OR r.dispatch_id IS NULL THEN
        RAISE EXCEPTION 'ab_step: item % got no lease: %', r.item, r.error;
      END IF;
      UPDATE public.ab_leases SET dispatch_id = r.dispatch_id, lease_token = r.lease_token WHERE pos = r.item;
    END LOOP;
  END IF;
END $$;
"""


# --batch: the batch route's two calls (the lines first, by a call of their own, then the results and the claim).
BATCH_SQL = """
CREATE TABLE public.ab_worker (worker_id text NOT NULL, session_token text NOT NULL, logs integer NOT NULL);
CREATE TABLE public.ab_leases (dispatch_id text PRIMARY KEY, lease_token text NOT NULL);
CREATE FUNCTION public.ab_step() RETURNS void LANGUAGE plpgsql AS $$
DECLARE
  w       record;
  v_n     integer;
  v_items jsonb;
  v_ans   jsonb;
BEGIN
  SELECT * INTO w FROM public.ab_worker;
  SELECT count(*) INTO v_n FROM public.ab_leases;
  IF w.logs > 0 THEN
    SELECT jsonb_agg(jsonb_build_object('dispatch_id', l.dispatch_id, 'lease_token', l.lease_token, 'offset', 0,
                                        'logs', (SELECT jsonb_agg('log line ' || i || ' of the task')
                                                   FROM generate_series(0, w.logs - 1) i)))
      INTO v_items FROM public.ab_leases l;
    PERFORM * FROM awp.report_progress_many(w.worker_id, w.session_token, v_items);
  END IF;
  SELECT jsonb_agg(jsonb_build_object('dispatch_id', l.dispatch_id, 'lease_token', l.lease_token,
                                      'result', '{"kind": "success"}'::jsonb))
    INTO v_items FROM public.ab_leases l;
  v_ans := awp.complete_tasks(w.worker_id, w.session_token, v_items, v_n, NULL);
  DELETE FROM public.ab_leases;
  INSERT INTO public.ab_leases SELECT x->>'dispatch_id', x->>'lease_token' FROM jsonb_array_elements(v_ans->'leases') x;
  IF (SELECT count(*) FROM public.ab_leases) <> v_n THEN
    RAISE EXCEPTION 'ab_step: % leases back for % results: %', (SELECT count(*) FROM public.ab_leases), v_n, v_ans;
  END IF;
END $$;
"""


def measured_run(conn: psycopg.Connection[Any], tasks: int, concurrency: int, pre: int, step_sql: str) -> None:
    """``pre`` tasks completed first (so that the tables are not small), the measured workflow (``tasks`` tasks, run
    concurrency ``concurrency``) and the step's functions (``step_sql``)."""
    if pre:
        define(conn, "ab-pre", pre)
        complete_all(conn, "ab-pre", 1)
    # Leases, attempts and sessions that outlive the count (under valgrind, a call takes a few hundred ms; no
    # coordinator runs), and no sign of life written by a claim within it (awp._claim_is_alive).
    conn.execute("SELECT awp.configure(lease_duration_ms => 86400000, heartbeat_interval_ms => 3600000)")
    define(conn, "ab", tasks, concurrency, timeout_ms=86400000)
    conn.execute(step_sql)


def prepare_batch(dsn: str, tasks: int, slots: int, pre: int, logs: int = 0) -> None:
    """One run of ``tasks`` tasks and one worker of ``slots`` slots holding ``slots`` of its leases (--batch)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        measured_run(conn, tasks, slots, pre, BATCH_SQL)
        register = "SELECT worker_id, session_token FROM awp.register_worker('ab', '{mock}', %s)"
        worker, token = one(conn, register, [slots])
        conn.execute("INSERT INTO public.ab_worker VALUES (%s, %s, %s)", [worker, token, logs])
        conn.execute("SELECT awp.start_run('ab')")
        conn.execute(
            "INSERT INTO public.ab_leases SELECT dispatch_id, lease_token FROM awp.claim_tasks(%s, %s, %s)",
            [worker, token, slots],
        )
        if one(conn, "SELECT count(*) FROM public.ab_leases")[0] != slots:
            raise SystemExit(f"could not lease {slots} tasks at once")
        conn.execute("VACUUM ANALYZE")


def prepare(dsn: str, tasks: int, group: int, pre: int, logs: int = 0) -> None:
    """One run of ``tasks`` tasks and ``group`` workers of one slot, each holding one of its leases; each completion
    carries ``logs`` log lines (its ``live_output``) when not 0."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        measured_run(conn, tasks, group, pre, STEP_SQL)
        live = sql.Literal(json.dumps(live_output(logs))) if logs else sql.SQL("NULL")
        conn.execute(
            sql.SQL(
                "CREATE FUNCTION public.ab_live() RETURNS jsonb LANGUAGE sql IMMUTABLE AS $$ SELECT {}::jsonb $$"
            ).format(live)
        )
        register = "SELECT worker_id, session_token FROM awp.register_worker('ab', '{mock}', 1)"
        workers = [one(conn, register) for _ in range(group)]
        conn.execute("SELECT awp.start_run('ab')")
        for pos, (worker, token) in enumerate(workers, start=1):
            lease = one(conn, "SELECT dispatch_id, lease_token FROM awp.claim_tasks(%s, %s, 1)", [worker, token])
            conn.execute("INSERT INTO public.ab_leases VALUES (%s, %s, %s, %s, %s)", [pos, worker, token, *lease])
        conn.execute("VACUUM ANALYZE")


def count(cluster: Cluster, dbname: str, steps: int, out: Path) -> int:
    """Instructions (callgrind's Ir) of a single-user backend that runs ``steps`` calls of ab_step() in ``dbname``."""
    script = "SELECT public.ab_step();\n" * steps
    cmd = [
        "valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", "--trace-children=no",
        pg_bin("postgres"), "--single", "-D", str(cluster.datadir), "-c", "fsync=off", "-c", "jit=off", dbname,
    ]  # fmt: skip
    out.parent.mkdir(parents=True, exist_ok=True)
    give_to_server_user(out.parent)
    res = subprocess.run(as_server_user(cmd), input=script, capture_output=True, text=True, cwd="/tmp")
    if res.returncode != 0 or "ERROR" in res.stdout + res.stderr.replace("ERROR SUMMARY", ""):
        raise SystemExit(f"{shlex.join(cmd)} failed:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
    found = re.search(r"Collected : (\d+)", res.stderr) or re.search(r"refs:\s+([\d,]+)", res.stderr)
    if not found:
        raise SystemExit(f"no instruction count in callgrind's output:\n{res.stderr[-2000:]}")
    return int(found.group(1).replace(",", ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("variants", nargs="+", help="checkouts or git revisions")
    parser.add_argument("--group", type=int, default=2, help="completions per call [%(default)s]")
    parser.add_argument("--steps", type=int, default=60, help="calls in the shorter count [%(default)s]")
    parser.add_argument("--tasks", type=int, default=1000, help="tasks of the measured run [%(default)s]")
    parser.add_argument("--pre", type=int, default=1000, help="tasks completed first [%(default)s]")
    parser.add_argument("--profile", type=Path, help="keep the longer count's callgrind profile of the last variant")
    parser.add_argument("--batch", type=int, help="the batch route: one worker of N slots (the figures per task)")
    args = parser.parse_args()
    if args.batch:
        args.group = args.batch
    if args.tasks < args.group * (3 * args.steps + 2):
        parser.error("--tasks too small for the steps")
    workdir = Path(tempfile.mkdtemp(prefix="awp-instr-", dir="/tmp"))
    try:
        give_to_server_user(workdir)
        measure(args, [variant(v, workdir) for v in args.variants], workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def measure(args: argparse.Namespace, variants: list[Variant], workdir: Path) -> None:
    cluster = Cluster(workdir / "data", free_port(), workdir / "run")
    cluster.init(sync=False)
    cluster.start(fsync=False)
    names = []
    try:
        for i, v in enumerate(variants):
            name = database_name(f"instr{i}")
            prepare_step = prepare_batch if args.batch else prepare
            prepare_step(
                fresh_database(cluster, name, sql_dir=v.sql_dir),
                args.tasks,
                args.group,
                args.pre,
                int(v.env.get("AB_LOGS", 0)),
            )
            names.append(name)
    finally:
        cluster.stop()
    base = None
    if args.batch:
        print(
            f"instructions per call of the batch route with {args.batch} leases"
            f" (callgrind Ir, {args.steps} calls counted)"
        )
    else:
        print(f"instructions per call of {args.group} completion(s) (callgrind Ir, {args.steps} calls counted)")
    for v, name in zip(variants, names, strict=True):
        short = count(cluster, name, args.steps, workdir / "cg" / "short.out")
        long_out = workdir / "cg" / "long.out"
        long = count(cluster, name, 2 * args.steps, long_out)
        per_call = (long - short) / args.steps
        base = base or per_call
        print(
            f"  {v.spec:30s} {per_call / 1e6:8.3f} M per call  {per_call / args.group / 1e6:8.3f} M per completion"
            f"  ratio {per_call / base:.3f}"
        )
        if args.profile:
            args.profile.write_bytes(long_out.read_bytes())


if __name__ == "__main__":
    main()
