"""Flat growth under a soak (docs/retention.md): many small runs against a real ``awp serve`` and real workers,
with a short retention, on a cluster of its own. After the first retention cycle the row counts and the sizes
of every AWP table stay within a bound while runs keep coming (without retention they would grow without end),
worker sessions ended by restarts are pruned too, and ``awp.check_invariants()`` finds nothing, during and
after. Prints the row counts and sizes over time, and the cost of one full prune batch.

``make test`` runs the short form (about 35 s of load); ``make soak`` the long one (``AWP_SOAK_SECONDS``,
default 240). The cluster's autovacuum looks every second (``autovacuum_naptime``): the soak compresses days of
retention into seconds, and the default minute between autovacuum rounds would be most of the soak.
"""

from __future__ import annotations

import os
import secrets
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import psycopg
import pytest
from psycopg.types.json import Jsonb
from worker_support import Workers, mock_task

from awp_testing.cluster import fresh_database, local_cluster, one
from awp_testing.gateway import serve, wait_until

pytestmark = pytest.mark.slow  # multi-process / long: make test-fast skips it

SOAK_SECONDS = float(os.environ.get("AWP_SOAK_SECONDS", "35"))
LONG = SOAK_SECONDS >= 120
RETENTION_MS = int(os.environ.get("AWP_SOAK_RETENTION_MS", "10000" if LONG else "3000"))
RETENTION_INTERVAL_MS = 500
RATE = float(os.environ.get("AWP_SOAK_RATE", "8"))  # runs started per second
SAMPLE_S = 5.0 if LONG else 2.0
RESTART_S = 10.0  # one worker is restarted (a new session) this often
TASKS = [
    mock_task("a"),
    mock_task("b", ["a"]),
    mock_task("c", ["a"]),
    mock_task("d", ["a"]),
    mock_task("e", ["b", "c", "d"]),
]


@dataclass
class Sample:
    t: float
    rows: dict[str, int]
    kb: dict[str, int]
    started: int
    ranges: dict[str, int]  # the size of each time range's partitions (kB, all eight tables)
    default_kb: int  # the size of the _default partitions (kB, all eight tables)


@dataclass
class Soak:
    dsn: str
    tables: list[str] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    started: int = 0
    violations: list[Any] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def sample(self, conn: psycopg.Connection[Any], t: float) -> Sample:
        rows, kb = {}, {}
        for table in self.tables:  # a partitioned table: its partitions, as they are now (migration 0023)
            rows[table] = one(conn, f"SELECT count(*) FROM awp.{table}")[0]
            kb[table] = one(
                conn,
                "SELECT (coalesce((SELECT sum(pg_total_relation_size(relid)) FROM pg_partition_tree(%s)),"
                " pg_total_relation_size(%s)) / 1024)::bigint",
                (f"awp.{table}", f"awp.{table}"),
            )[0]
        # Each time range's partitions (awp.history_partitions, the eight tables of awp._history_tables()), and the
        # _default ones (suffix NULL), in one statement; a range dropped meanwhile counts 0 (to_regclass: NULL).
        parts = dict(
            conn.execute(
                "SELECT p.suffix, (coalesce(sum(pg_total_relation_size(to_regclass("
                "format('awp.%I', t.tab || p.part)))), 0) / 1024)::bigint"
                " FROM (SELECT suffix, '_p' || suffix AS part FROM awp.history_partitions"
                " UNION ALL SELECT NULL, '_default') p CROSS JOIN awp._history_tables() t GROUP BY p.suffix"
            ).fetchall()
        )
        default_kb = parts.pop(None)
        s = Sample(t, rows, kb, self.started, parts, default_kb)
        self.samples.append(s)
        return s


def _submit(gw: Any, wid: str, soak: Soak, stop: threading.Event) -> None:
    with httpx.Client(base_url=gw.base_url, headers=gw.auth("operator"), timeout=10) as http:
        begin = time.monotonic()
        while not stop.is_set():
            due = begin + soak.started / RATE
            if time.monotonic() < due:
                stop.wait(due - time.monotonic())
                continue
            r = http.post(
                f"/api/v1/workflows/{wid}/versions/1/runs", json={}, headers={"Idempotency-Key": secrets.token_hex(8)}
            )
            if r.status_code != 202:
                soak.errors.append(f"start run: {r.status_code} {r.text[:200]}")
                stop.wait(0.5)
                continue
            soak.started += 1


def _table(soak: Soak) -> str:
    short = {"idempotency_keys": "idem_keys", "status_counts": "st_counts", "workflow_versions": "wf_vers"}
    cols = [t for t in soak.tables if t not in ("settings",)]
    head = (
        f"{'t(s)':>6} {'started':>7} "
        + " ".join(f"{short.get(c, c):>10}" for c in cols)
        + f" {'total kB':>9} {'ranges kB':>20} {'_default kB':>11}"
    )
    lines = ["rows per table, and the total size of every awp table (kB):", head]
    for s in soak.samples:
        total = sum(s.kb.values())
        ranges = "+".join(str(v) for _, v in sorted(s.ranges.items()))
        lines.append(
            f"{s.t:6.0f} {s.started:7d} "
            + " ".join(f"{s.rows[c]:10d}" for c in cols)
            + f" {total:9d} {ranges:>20} {s.default_kb:11d}"
        )
    lines.append("size of each table (kB, with its indexes and TOAST): first sample after warm-up, then last")
    warm = _warm(soak)
    first, last = warm[0], soak.samples[-1]
    lines.append("  " + ", ".join(f"{c} {first.kb[c]}->{last.kb[c]}" for c in soak.tables))
    return "\n".join(lines)


def _warm(soak: Soak) -> list[Sample]:
    """Samples after the first retention cycle: retention and two time ranges of half of it (docs/retention.md,
    Partitions) + a few retention intervals + the slowest run."""
    warmup = 2 * RETENTION_MS / 1000 + 5 * RETENTION_INTERVAL_MS / 1000 + 3
    return [s for s in soak.samples if s.t >= warmup]


def _full_batch_cost(dsn: str, n_runs: int = 200) -> str:
    """Finish ``n_runs`` 5-task runs through the real functions (a SQL worker), then time one prune batch of them
    (the coordinator's batch: at most 200 runs / 5,000 of their tasks)."""
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("SELECT awp.configure(retention_ms => 0)")  # the background leaves them to us
        wid = "soak-batch"
        c.execute("SELECT awp.create_workflow_version(%s)", (Jsonb({"id": wid, "tasks": TASKS}),))
        worker, token = one(c, "SELECT worker_id, session_token FROM awp.register_worker('sql', '{mock}', 100)")
        for _ in range(n_runs):
            c.execute("SELECT awp.start_run(%s)", (wid,))
        done = 0
        while done < n_runs:
            c.execute("SELECT awp.create_dispatches()")
            leases = c.execute(
                "SELECT dispatch_id, lease_token FROM awp.claim_tasks(%s, %s, 100)", (worker, token)
            ).fetchall()
            for dispatch_id, lease in leases:
                c.execute(
                    'SELECT awp.complete_task(%s, %s, %s, %s, \'{"kind": "success", "output": {"ok": 1}}\')',
                    (worker, token, dispatch_id, lease),
                )
            done = one(c, "SELECT count(*) FROM awp.runs WHERE workflow_id = %s AND status = 'succeeded'", (wid,))[0]
            if not leases and done < n_runs:
                time.sleep(0.05)
        c.execute("SELECT status FROM awp.drain_worker(%s, %s)", (worker, token))
        rows = one(
            c,
            "SELECT (SELECT count(*) FROM awp.tasks t JOIN awp.runs r USING (run_id) WHERE r.workflow_id = %s),"
            " (SELECT count(*) FROM awp.events e JOIN awp.runs r USING (run_id) WHERE r.workflow_id = %s)",
            (wid, wid),
        )
        started = time.perf_counter()
        batch = one(c, "SELECT awp._prune_batch(clock_timestamp())")[0]
        ms = (time.perf_counter() - started) * 1000
    return (
        f"one prune batch: {batch['runs']} runs, {batch['tasks']} tasks, {batch['dispatches']} dispatches, "
        f"{batch['attempts']} attempts, {batch['events']} events, {batch['workers']} worker(s), "
        f"{batch['idempotency_keys']} idempotency keys in {ms:.0f} ms "
        f"({ms / max(1, batch['runs']):.2f} ms per run; there were {rows[0]} tasks and {rows[1]} events)"
    )


def test_soak_row_counts_and_table_sizes_stay_flat_under_retention() -> None:
    with local_cluster(fsync=False, prefix="awp-soak-") as cluster:
        with psycopg.connect(cluster.dsn(), autocommit=True) as c:
            c.execute("ALTER SYSTEM SET autovacuum_naptime = '1s'")
            c.execute("SELECT pg_reload_conf()")
        dsn = fresh_database(cluster, "awp_soak")
        soak = Soak(dsn)
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute(
                "SELECT awp.configure(lease_duration_ms => 10000, heartbeat_interval_ms => 1000, retention_ms => %s)",
                (RETENTION_MS,),
            )
            # The time ranges the migration made follow the default retention (3.5 days each): a new range length
            # applies from the next range on. Made again here, as if the retention had been set before the database
            # was migrated: ranges of half this retention, dropped whole during the soak (docs/retention.md).
            c.execute("SELECT awp._drop_history_partitions(h.suffix) FROM awp.history_partitions h")
            c.execute("SELECT awp.maintain_partitions()")
            soak.tables = [
                r[0]
                for r in c.execute(
                    "SELECT relname FROM pg_class WHERE relnamespace = 'awp'::regnamespace AND relkind IN ('r', 'p')"
                    " AND NOT relispartition ORDER BY relname"
                ).fetchall()
            ]
        env = {"AWP_RETENTION_INTERVAL_MS": str(RETENTION_INTERVAL_MS)}
        with serve(dsn, coordinator_interval_ms=100, env=env) as gw, Workers(gw) as workers:
            wid = "soak"
            r = httpx.post(
                gw.api("/workflows"),
                json={"id": wid, "concurrency": 5, "tasks": TASKS},
                headers={**gw.auth("operator"), "Idempotency-Key": "soak-wf"},
            )
            assert r.status_code == 201, r.text
            live = [workers.start(f"soak-{i}", concurrency=4, wait_ms=1000) for i in range(2)]
            stop = threading.Event()
            submitter = threading.Thread(target=_submit, args=(gw, wid, soak, stop), daemon=True)
            begin = time.monotonic()
            submitter.start()
            next_restart = begin + RESTART_S
            next_check = begin + 10
            restarts = 0
            with psycopg.connect(dsn, autocommit=True) as c:
                while (now := time.monotonic()) - begin < SOAK_SECONDS:
                    soak.sample(c, now - begin)
                    if now >= next_restart:  # a restart: the old session stops, a new one registers
                        old = live.pop(0)
                        old.signal(signal.SIGTERM)
                        assert old.wait_exit(15) == 0, old.log()[-2000:]
                        restarts += 1
                        live.append(workers.start(f"soak-r{restarts}", concurrency=4, wait_ms=1000))
                        next_restart += RESTART_S
                    if now >= next_check:
                        soak.violations += c.execute("SELECT * FROM awp.check_invariants()").fetchall()
                        next_check += 10
                    time.sleep(max(0.0, SAMPLE_S - (time.monotonic() - now)))
                stop.set()
                submitter.join(10)
                wait_until(
                    lambda: one(c, "SELECT count(*) FROM awp.runs WHERE status IN ('pending', 'running')")[0] == 0,
                    30,
                    0.2,
                    "the last runs to finish",
                )
                soak.sample(c, time.monotonic() - begin)
                soak.violations += c.execute("SELECT * FROM awp.check_invariants()").fetchall()
                finished = one(c, "SELECT count(*) FROM awp.runs WHERE status = 'succeeded'")[0]
                metrics = httpx.get(gw.url("/metrics")).text
            batches = {
                line.split()[0]: float(line.split()[-1])
                for line in metrics.splitlines()
                if line.startswith(
                    ("awp_retention_batch_duration_seconds_sum", "awp_retention_batches_total", "awp_pruned_total")
                )
            }
        cost = _full_batch_cost(dsn)

        print()
        print(
            f"soak: {SOAK_SECONDS:.0f} s, {RATE:g} runs/s of {len(TASKS)} tasks, retention {RETENTION_MS} ms "
            f"(batches every {RETENTION_INTERVAL_MS} ms), 2 workers x 4 restarted every {RESTART_S:.0f} s "
            f"({restarts} restarts); {soak.started} runs started"
        )
        print(_table(soak))
        n = batches.get("awp_retention_batches_total", 0)
        avg_ms = batches.get("awp_retention_batch_duration_seconds_sum", 0) / max(n, 1) * 1000
        pruned = ", ".join(
            f"{k.split(chr(34))[1]} {v:.0f}" for k, v in batches.items() if k.startswith("awp_pruned_total")
        )
        print(f"background retention: {n:.0f} batches, {avg_ms:.1f} ms each on average; pruned {pruned}")
        print(cost)
        print(f"invariant violations: {len(soak.violations)}")

        assert not soak.errors, soak.errors[:5]
        assert batches.get('awp_pruned_total{kind="partitions"}', 0) >= 2, "time ranges were dropped whole"
        assert soak.violations == [], soak.violations[:10]
        warm = _warm(soak)
        assert len(warm) >= 6, "the soak is too short for its retention"
        assert soak.started >= RATE * SOAK_SECONDS * 0.7, "the load kept its rate"
        half = len(warm) // 2
        first, second = warm[:half], warm[half:]
        # Rows: what is retained is a window of the last retention_ms, so the second half holds no more than the
        # first (plus jitter); and far fewer runs than were started.
        for table in soak.tables:
            a, b = max(s.rows[table] for s in first), max(s.rows[table] for s in second)
            assert b <= 1.5 * a + 30, f"{table}: {a} rows in the first half after warm-up, {b} in the second"
        most_runs = max(s.rows["runs"] for s in warm)
        # Kept: the retention, plus until its time range goes whole (ranges of half the retention: at most two more
        # of them, docs/retention.md, Partitions).
        assert most_runs <= RATE * (2 * RETENTION_MS / 1000 + 4) * 1.5, f"{most_runs} runs retained at once"
        assert soak.started >= 3 * most_runs, "pruning kept the runs table far below what was started"
        assert finished <= RATE * (2 * RETENTION_MS / 1000 + 4) * 1.5
        ended = max(s.rows["workers"] for s in warm)
        assert ended <= 2 + (RETENTION_MS / 1000 / RESTART_S + 3), f"{ended} worker sessions retained"
        # Sizes. What the time ranges hold is dropped whole, so the total swings with how many ranges exist when a
        # sample is taken (2 to 4 here, some 700 kB each): compared as its parts.
        # - The number of ranges stays bounded: the retention's three, the one made ahead, and two more while a range
        #   waits for its last run or the next batch (docs/retention.md, Partitions).
        # - No range grows far past the largest of the first half: a range holds range_ms of runs (more after the
        #   submitter catches up on a stall).
        # - The _default partitions hold the runs of a range the coordinator could not make in time (its locks not
        #   granted within 100 ms in any batch of the whole range before it, 1.5 s here, on a busy machine), pruned row
        #   by row: the second half may add two such ranges, no more.
        # - The rest (the tables not partitioned, the _legacy partitions) stops growing, since autovacuum makes the
        #   space of pruned rows reusable.
        most_ranges = max(len(s.ranges) for s in warm)
        range_a = max(max(s.ranges.values(), default=0) for s in first)
        range_b = max(max(s.ranges.values(), default=0) for s in second)
        default_a = max(s.default_kb for s in first)
        default_b = max(s.default_kb for s in second)
        rest_a = max(sum(s.kb.values()) - sum(s.ranges.values()) - s.default_kb for s in first)
        rest_b = max(sum(s.kb.values()) - sum(s.ranges.values()) - s.default_kb for s in second)
        print(
            f"after warm-up, first half then second: at most {most_ranges} time ranges; the largest range "
            f"{range_a} kB, then {range_b}; the _default partitions {default_a} kB, then {default_b}; the rest "
            f"{rest_a} kB, then {rest_b}"
        )
        assert most_ranges <= 6, f"{most_ranges} time ranges at once"
        assert range_b <= 1.5 * range_a + 512, (
            f"a range of {range_a} kB in the first half after warm-up, {range_b} after"
        )
        assert default_b <= 1.3 * default_a + 2 * range_a + 512, (
            f"the _default partitions: {default_a} kB in the first half after warm-up, {default_b} after"
        )
        assert rest_b <= 1.3 * rest_a + 512, (
            f"outside the partitions of history, {rest_a} kB in the first half after warm-up, {rest_b} kB after"
        )


# ---- dropping a time range of history: its cost does not grow with what it holds -------------------------------------

DAY_MS = 86_400_000
EVENTS_PER_RUN = 6
DROP_SIZES = (10_000, 100_000, 1_000_000) if LONG else (2_000, 20_000)
ROW_BY_ROW_UPTO = 100_000  # row by row, a million runs would take minutes: measured up to this size


def _plant(c: psycopg.Connection[Any], lower_ms: int | None, n: int) -> None:
    """``n`` finished one-task runs (a task, a dispatch, EVENTS_PER_RUN events each) planted straight into the tables:
    with ``lower_ms``, time ids spread over the day from it (its range); without, old-style ids (a _default
    partition's rows, pruned row by row as before migration 0023)."""
    for lo in range(0, n, 100_000):
        hi = min(n, lo + 100_000) - 1
        if lower_ms is None:
            run = "'run_old' || lpad(to_hex(g), 12, '0')"
            dsp = "'dsp_old' || lpad(to_hex(g), 12, '0')"
        else:
            run = f"awp._time_key('run', {lower_ms} + g::bigint * {DAY_MS} / {n}) || lpad(to_hex(g), 19, '0')"
            dsp = f"'dsp_' || substr({run}, 5, 13) || lpad(to_hex(g), 19, '0')"
        at = "now() - interval '3 days'"
        c.execute(
            "INSERT INTO awp.runs (run_id, workflow_id, workflow_version, status, concurrency, unfinished_tasks,"
            " last_sequence, created_at, started_at, finished_at, final_task_counts)"
            f" SELECT {run}, 'hist', 1, 'succeeded', 1, 0, {EVENTS_PER_RUN}, {at}, {at}, {at}, '{{\"succeeded\": 1}}'"
            " FROM generate_series(%s::int, %s::int) g",
            (lo, hi),
        )
        c.execute(
            "INSERT INTO awp.tasks (run_id, task_key, ordinal, executor, action, input, depends_on, dependants,"
            " pending_deps, max_attempts, interval_ms, timeout_ms, status, updated_at, finished_at)"
            f" SELECT {run}, 'a', 1, 'mock', 'a', '{{}}', '{{}}', '{{}}', 0, 1, 0, 1000, 'canceled', {at}, {at}"
            " FROM generate_series(%s::int, %s::int) g",
            (lo, hi),
        )
        c.execute(
            "INSERT INTO awp.dispatches (dispatch_id, run_id, task_key, executor_kind, status, created_at, finished_at)"
            f" SELECT {dsp}, {run}, 'a', 'mock', 'canceled', {at}, {at} FROM generate_series(%s::int, %s::int) g",
            (lo, hi),
        )
        c.execute(
            "INSERT INTO awp.events (run_id, sequence, revision, entity_type, entity_key, to_status, reason,"
            " occurred_at)"
            f" SELECT {run}, s, s, 'task', 'a', 'canceled', 'planted', {at}"
            f" FROM generate_series(%s::int, %s::int) g, generate_series(1, {EVENTS_PER_RUN}) s",
            (lo, hi),
        )


def _awp_mb(c: psycopg.Connection[Any]) -> float:
    """The size of AWP's tables, but awp.status_counts: the planting's own inserts leave a delta row per run there
    (compacted by each prune; the space is reused, not returned at once)."""
    return float(
        one(
            c,
            "SELECT sum(pg_total_relation_size(c.oid)) / 1048576.0 FROM pg_class c"
            " WHERE c.relnamespace = 'awp'::regnamespace AND c.relkind = 'r' AND c.relname <> 'status_counts'",
        )[0]
    )


class HotPathProbe:
    """Reads a run (``awp.run_revision``) in a loop on a connection of its own while the block runs; ``max_ms``: the
    longest one read took (a read waits while a partition drop holds the run-scoped tables' locks)."""

    def __init__(self, dsn: str, run_id: str) -> None:
        self.dsn, self.run_id = dsn, run_id
        self.max_ms = 0.0
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as c:
            while not self._stop.is_set():
                t = time.perf_counter()
                c.execute("SELECT * FROM awp.run_revision(%s)", (self.run_id,)).fetchall()
                self.max_ms = max(self.max_ms, (time.perf_counter() - t) * 1000)
                self._ready.set()

    def __enter__(self) -> HotPathProbe:
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        time.sleep(0.05)  # a read queued behind the drop ends after it
        self._stop.set()
        self._thread.join(10)


def test_dropping_a_range_of_history_costs_the_same_whatever_it_holds() -> None:
    """One day of history, planted with 10,000 to 1,000,000 runs (short form: 2,000 and 20,000), is dropped whole by
    ``awp.prune``: the time it takes does not grow with the runs, and the space goes with it. For comparison the same
    runs pruned row by row (as every run was before migration 0023), up to ROW_BY_ROW_UPTO."""
    with local_cluster(fsync=False, prefix="awp-soak-") as cluster:
        dsn = fresh_database(cluster, "awp_ranges")
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute("SELECT awp.configure(history_partition_ms => %s, retention_ms => %s)", (DAY_MS, DAY_MS))
            c.execute("SELECT awp.create_workflow_version(%s)", (Jsonb({"id": "hist", "tasks": [mock_task("a")]}),))
            today = one(c, "SELECT min(lower_ms) FROM awp.history_partitions")[0]
            live_run = one(c, "SELECT awp.start_run('hist')")[0]  # today's, pending: the hot path's reads of it
            lines, drops, sizes_mb = [], [], []
            waits: list[float] = []
            statements: list[float] = []  # the SQL part of each drop (before its commit)
            compared: list[tuple[float, float]] = []  # (drop ms, row by row ms) of the sizes measured both ways
            for i, n in enumerate(DROP_SIZES):
                lower = today - (10 - i) * DAY_MS  # a past day of its own
                suffix = f"planted{i}"
                c.execute("SET ROLE awp_owner")  # the owner of AWP's tables owns their partitions
                c.execute(
                    "SELECT awp._make_history_partition(t.tab, t.prefix, %s, %s, %s) FROM awp._history_tables() t",
                    (lower, lower + DAY_MS, suffix),
                )
                c.execute("RESET ROLE")
                c.execute(
                    "INSERT INTO awp.history_partitions VALUES (%s, %s, %s, now())", (lower, lower + DAY_MS, suffix)
                )
                base_mb = _awp_mb(c)
                _plant(c, lower, n)
                c.execute("ANALYZE")  # autovacuum's work, done now: the drop counts by these statistics
                # and the coordinator's: its retention batches fold the runs-by-status deltas (one per run planted
                # here at once) every few seconds; unfolded, the drop's DELETE of its range's counts reads them all
                c.execute("SELECT awp._compact_status_counts()")
                full_mb = _awp_mb(c)
                with HotPathProbe(dsn, live_run) as probe:  # a reader of a live run meanwhile: what it waits
                    started = time.perf_counter()
                    with c.transaction():
                        result = one(c, "SELECT awp.prune('1 hour')")[0]
                        statement_ms = (time.perf_counter() - started) * 1000
                    drop_ms = (time.perf_counter() - started) * 1000
                waits.append(probe.max_ms)
                statements.append(statement_ms)
                after_mb = _awp_mb(c)
                assert one(c, "SELECT count(*) FROM awp.history_partitions WHERE suffix = %s", (suffix,))[0] == 0
                assert abs(result["runs"] - n) <= 0.1 * n and abs(result["events"] - EVENTS_PER_RUN * n) <= 0.1 * (
                    EVENTS_PER_RUN * n
                ), result
                assert after_mb <= base_mb + 1, f"{n} runs: {base_mb:.1f} MB before, {after_mb:.1f} MB after the drop"
                row_ms = None
                if n <= ROW_BY_ROW_UPTO:
                    _plant(c, None, n)
                    started = time.perf_counter()
                    while one(c, "SELECT awp.prune('1 hour')")[0]["more"]:
                        pass
                    row_ms = (time.perf_counter() - started) * 1000
                    assert one(c, "SELECT count(*) FROM awp.runs WHERE run_id <> %s", (live_run,))[0] == 0
                drops.append(drop_ms)
                sizes_mb.append(full_mb - base_mb)
                if row_ms is not None:
                    compared.append((drop_ms, row_ms))
                lines.append(
                    f"{n:>9} {n * (3 + EVENTS_PER_RUN):>10} {full_mb - base_mb:>9.1f} {drop_ms:>9.1f} "
                    f"{statement_ms:>9.1f} {probe.max_ms:>9.1f} "
                    f"{(f'{row_ms:,.0f}' if row_ms is not None else '-'):>14} {after_mb - base_mb:>+8.2f}"
                )
            assert c.execute("SELECT * FROM awp.check_invariants()").fetchall() == []
        print()
        print(f"a day of history (1 task, 1 dispatch, {EVENTS_PER_RUN} events per run) dropped whole by awp.prune:")
        print(
            f"{'runs':>9} {'rows':>10} {'MB':>9} {'drop ms':>9} {'of it SQL':>9} {'hot wait':>9} {'row by row ms':>14}"
            f" {'MB left':>8}"
        )
        print("\n".join(lines))
        print(
            "drop ms: the awp.prune call with its commit; of it SQL: before the commit (the rest is the file system"
            " freeing the files, after the locks are gone); hot wait: the longest a reader of a live run waited"
        )
        # The database's part is flat (a few index probes, the catalog): what grows is the file system freeing the
        # partitions' files, about 0.1-0.4 ms per MB here (2.4 GB: about a second). Row by row it was about 0.7 ms
        # per run (a million runs: some twelve minutes).
        assert drops[-1] <= 10 * drops[0] + 1.0 * sizes_mb[-1] + 500, (drops, sizes_mb)
        assert 20 * compared[-1][0] <= compared[-1][1], compared
        # The SQL part (what holds the locks) hardly grows (measured: 12, 19, 48 ms for 10,000 to 1,000,000 runs), and
        # the locks are gone before the files are freed: a reader waits for the SQL part only, whatever the size.
        assert statements[-1] <= 10 * statements[0] + 200, statements
        assert max(waits) <= max(statements) + 1000, (waits, statements)
