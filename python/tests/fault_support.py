"""Shared pieces of the multi-process fault suite (test_faults*.py, test_chaos.py).

- :func:`record` prints a scenario's measured figures (visible with ``pytest -s``) and merges them into
  ``benchmarks/results/faults.json``.
- :func:`configure`, :func:`query`, :func:`violations`, :func:`assert_clean`: the database side, through a
  superuser connection (the checker ``awp.check_invariants()`` is the verdict of every scenario).
- :class:`FakeWorker`: a worker driven by the test over real HTTP, for scenarios that need the lease token
  (a late complete with an old lease, a lost response, a revoked heartbeat).
- :class:`InvariantSampler`: samples ``awp.check_invariants()`` every ~50 ms in a REPEATABLE READ
  transaction while the system runs; ``stop()`` fails when no sample ran or a sample failed with an SQL
  error (only connection errors, as during a database restart, are tolerated).
- :func:`own_cluster`: a throwaway PostgreSQL cluster the test may stop, restart and terminate backends of
  (never the shared session cluster).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar

import httpx
import psycopg
from psycopg.abc import QueryNoTemplate
from psycopg.rows import dict_row

from awp.dev.localdb import Cluster
from awp_testing.cluster import database_name, fresh_database, local_cluster
from awp_testing.gateway import PROTOCOL, ServeProcess, bearer, wait_until

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "benchmarks" / "results" / "faults.json"
TERMINAL = ("succeeded", "failed", "canceled")

# Short timings for every scenario (lease 1-2 s, heartbeat 100-200 ms).
LEASE_MS = 1500
HEARTBEAT_MS = 150


# ---- measured figures ------------------------------------------------------------------------------------


def record(scenario: str, **figures: Any) -> None:
    """Print the figures of one scenario and merge them into benchmarks/results/faults.json."""
    print(f"\n[fault] {scenario}: " + ", ".join(f"{k}={v}" for k, v in figures.items()), flush=True)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    data: dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError):
        data = json.loads(RESULTS.read_text())
    data["machine"] = {"cpus": os.cpu_count()}
    data.setdefault("scenarios", {})[scenario] = {
        **figures,
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    tmp = RESULTS.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    tmp.replace(RESULTS)


def ms(seconds: float) -> int:
    return round(seconds * 1000)


# ---- database side ---------------------------------------------------------------------------------------


def query(dsn: str, sql: QueryNoTemplate, params: Any = ()) -> list[dict[str, Any]]:
    with psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as c:
        cur = c.execute(sql, params)
        return cur.fetchall() if cur.description else []


def configure(dsn: str, lease_ms: int = LEASE_MS, heartbeat_ms: int = HEARTBEAT_MS, **others: int) -> None:
    args = ", ".join(f"{k} => %s" for k in others)
    query(
        dsn,
        f"SELECT awp.configure(lease_duration_ms => %s, heartbeat_interval_ms => %s{', ' if args else ''}{args})",
        (lease_ms, heartbeat_ms, *others.values()),
    )


def violations(dsn: str, run_ids: list[str] | None = None) -> list[dict[str, Any]]:
    return query(dsn, "SELECT * FROM awp.check_invariants(%s)", (run_ids,))


def assert_clean(dsn: str) -> None:
    """Every run terminal and the invariant checker empty (the end of every scenario)."""
    live = query(dsn, "SELECT run_id, status FROM awp.runs WHERE status NOT IN ('succeeded', 'failed', 'canceled')")
    assert live == [], f"runs not terminal: {live}"
    found = violations(dsn)
    assert found == [], "invariant violations:\n" + "\n".join(map(str, found))


def run_row(dsn: str, run_id: str) -> dict[str, Any]:
    return query(dsn, "SELECT * FROM awp.get_run(%s)", (run_id,))[0]


def task_rows(dsn: str, run_id: str) -> dict[str, dict[str, Any]]:
    return {t["task_key"]: t for t in query(dsn, "SELECT * FROM awp.run_tasks(%s)", (run_id,))}


def attempts(dsn: str, run_id: str, task_key: str) -> list[dict[str, Any]]:
    return query(dsn, "SELECT * FROM awp.task_attempts(%s, %s) ORDER BY attempt", (run_id, task_key))


def wait_run_db(dsn: str, run_id: str, timeout: float = 30.0) -> dict[str, Any]:
    return wait_until(
        lambda: (r := run_row(dsn, run_id))["status"] in TERMINAL and r, timeout, 0.05, f"run {run_id} to end"
    )


def wait_runs_db(dsn: str, run_ids: list[str], timeout: float = 60.0) -> None:
    wait_until(
        lambda: (
            not query(
                dsn,
                "SELECT 1 FROM awp.runs WHERE run_id = ANY(%s) AND status NOT IN ('succeeded','failed','canceled')",
                (run_ids,),
            )
        ),
        timeout,
        0.1,
        f"{len(run_ids)} runs to end",
    )


def worker_by_name(dsn: str, name: str) -> dict[str, Any]:
    rows = query(dsn, "SELECT * FROM awp.list_workers() WHERE display_name = %s", (name,))
    return rows[-1] if rows else {}


# ---- a worker driven by the test ---------------------------------------------------------------------------


class FakeWorker:
    """One worker session over real HTTP; the test decides when it claims, which leases its background
    heartbeats renew, when it completes, and when it "dies" (:meth:`stop_heartbeats`)."""

    alive: ClassVar[list[FakeWorker]] = []  # every instance whose heartbeat thread may run: see stop_all()

    def __init__(
        self,
        gw: ServeProcess,
        name: str = "fake",
        kinds: tuple[str, ...] = ("mock",),
        concurrency: int = 1,
        heartbeat: bool = True,
    ) -> None:
        self.gw = gw
        r = httpx.post(
            gw.api("/workers/register"),
            json={"display_name": name, "executor_kinds": list(kinds), "max_concurrency": concurrency},
            headers=gw.auth("bootstrap"),
            timeout=10,
        )
        assert r.status_code == 201, r.text
        self.worker_id: str = r.json()["worker_id"]
        self.headers = {**bearer(r.json()["session_token"]), **PROTOCOL}
        self.heartbeat_interval_s = r.json()["heartbeat_interval_ms"] / 1000
        self._beating = threading.Event()
        self._thread: threading.Thread | None = None
        self.beat_leases: list[dict[str, Any]] = []
        if heartbeat:  # like a real worker: idle heartbeats from the start, or the session goes offline
            self.start_heartbeats()

    def post(self, path: str, body: dict[str, Any], timeout: float = 15.0) -> httpx.Response:
        return httpx.post(
            self.gw.api(f"/workers/{self.worker_id}{path}"), json=body, headers=self.headers, timeout=timeout
        )

    def claim(self, slots: int = 1, wait_ms: int = 5000) -> list[dict[str, Any]]:
        r = self.post("/claims", {"slots": slots, "wait_ms": wait_ms})
        assert r.status_code == 200, r.text
        return r.json()["leases"]

    def claim_one(self, timeout: float = 10.0) -> dict[str, Any]:
        return wait_until(lambda: (leases := self.claim(1, 1000)) and leases[0], timeout, 0.0, "a lease")

    def heartbeat(self, leases: list[dict[str, Any]]) -> dict[str, str]:
        body = {"leases": [{"dispatch_id": x["dispatch_id"], "lease_token": x["lease_token"]} for x in leases]}
        r = self.post("/heartbeat", body)
        assert r.status_code == 200, r.text
        return {x["dispatch_id"]: x["status"] for x in r.json()["leases"]}

    def complete(self, lease: dict[str, Any], kind: str = "success", **fields: Any) -> httpx.Response:
        body = {"lease_token": lease["lease_token"], "result": {"kind": kind, **fields}}
        return self.post(f"/leases/{lease['dispatch_id']}/complete", body)

    def start_heartbeats(self, leases: list[dict[str, Any]] | None = None) -> None:
        """Heartbeat in the background every interval with ``leases`` (idle when empty; replaces the list
        of a loop already running)."""
        self.beat_leases = list(leases or [])
        if self._beating.is_set():
            return
        self._beating.set()

        def loop() -> None:
            while self._beating.is_set():
                with contextlib.suppress(httpx.HTTPError, AssertionError):
                    self.heartbeat(self.beat_leases)
                time.sleep(self.heartbeat_interval_s)

        self._thread = threading.Thread(target=loop, daemon=True, name=f"heartbeat-{self.worker_id}")
        self._thread.start()
        FakeWorker.alive.append(self)

    def stop_heartbeats(self) -> None:
        """Silence, as if the process had died (kill -9)."""
        self._beating.clear()
        if self._thread is not None:
            self._thread.join(5)

    @classmethod
    def stop_all(cls) -> None:
        while cls.alive:
            cls.alive.pop().stop_heartbeats()


# ---- sampling the invariants while the system runs -----------------------------------------------------------


class InvariantSampler:
    """Calls ``awp.check_invariants()`` every ``interval`` s in a REPEATABLE READ transaction (one snapshot).

    Connection errors (``psycopg.OperationalError``: a database restart, a terminated backend) are counted in
    ``errors`` and the sampler reconnects; any other error (an SQL error of the checker) is a failure.
    ``stop()`` returns the violations seen, and raises AssertionError when a sample failed with an SQL error or
    when no sample ran at all (a sampler that checked nothing must not pass as "no violation").
    """

    def __init__(self, dsn: str, interval: float = 0.05) -> None:
        self.dsn = dsn
        self.interval = interval
        self.samples = 0
        self.errors = 0  # connection errors (tolerated)
        self.sql_errors: list[str] = []  # anything else (a failure)
        self.found: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="invariant-sampler")

    def __enter__(self) -> InvariantSampler:
        self._thread.start()
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None and not self._stop.is_set():  # not stopped (and judged) by the test already
            self.stop()
        else:  # the test failed already: just end the thread, do not mask its error
            self._stop.set()
            self._thread.join(10)

    def _loop(self) -> None:
        conn: psycopg.Connection[Any] | None = None
        while not self._stop.is_set():
            try:
                if conn is None or conn.closed:
                    conn = psycopg.connect(self.dsn, row_factory=dict_row, connect_timeout=2)
                    conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
                with conn.transaction():
                    rows = conn.execute("SELECT * FROM awp.check_invariants()").fetchall()
                self.samples += 1
                for row in rows:
                    if len(self.found) < 50:
                        self.found.append(row)
            except psycopg.OperationalError:
                self.errors += 1
                if conn is not None:
                    with contextlib.suppress(Exception):
                        conn.close()
                conn = None
                self._stop.wait(0.2)
            except psycopg.Error as e:
                self.sql_errors.append(f"{type(e).__name__} ({e.sqlstate}): {e}")
                if len(self.sql_errors) >= 5:  # failing for good: stop() reports it
                    break
            self._stop.wait(self.interval)
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    def stop(self) -> list[dict[str, Any]]:
        self._stop.set()
        self._thread.join(10)
        assert not self._thread.is_alive(), "the invariant sampler did not stop within 10 s"
        assert not self.sql_errors, "awp.check_invariants() failed while sampling:\n" + "\n".join(self.sql_errors)
        assert self.samples > 0, (
            f"the invariant sampler took no sample ({self.errors} connection errors): it checked nothing"
        )
        return self.found


def start_registered(workers: Any, dsn: str, names: list[str], concurrency: int) -> tuple[list[Any], dict[str, str]]:
    """Start real ``awp worker`` processes (``worker_support.Workers``), wait until each has registered, and
    return them with their session ids by name."""
    procs = [workers.start(name, concurrency=concurrency) for name in names]
    for w in procs:
        w.wait_log("registered as")
    return procs, {w.name: worker_by_name(dsn, w.name)["worker_id"] for w in procs}


# ---- a cluster of our own ----------------------------------------------------------------------------------


def own_cluster() -> contextlib.AbstractContextManager[Cluster]:
    """A throwaway cluster (fsync off) that the test may stop, restart or terminate backends of."""
    return local_cluster(prefix="awp-fault-")


@contextlib.contextmanager
def stoppable_database(cluster: Cluster, hint: str) -> Iterator[str]:
    """A fresh migrated database (synchronous_commit on) on ``cluster``, which the test may stop: a stopped
    cluster is started again before the database is made and before it is dropped."""
    if not cluster.status().running:  # a failed scenario may have left it stopped
        cluster.start(fsync=False)
    name = database_name(hint)
    dsn = fresh_database(cluster, name)
    query(dsn, f'ALTER DATABASE "{name}" SET synchronous_commit = on')
    try:
        yield dsn
    finally:
        if not cluster.status().running:
            cluster.start(fsync=False)
        cluster.drop_database(name)


def terminate_backends(dsn: str, where: str) -> int:
    """pg_terminate_backend on this database's sessions matching ``where`` (over pg_stat_activity a)."""
    rows = query(
        dsn,
        "SELECT count(*) FILTER (WHERE pg_terminate_backend(a.pid)) AS n FROM pg_stat_activity a "
        f"WHERE a.datname = current_database() AND a.pid <> pg_backend_pid() AND ({where})",
    )
    return int(rows[0]["n"])
