"""Fault scenario 12 (issue 6): a bounded chaos soak. Two gateways and several workers on a cluster of their
own; for ``AWP_CHAOS_SECONDS`` (default 20; ``make chaos`` runs 60) workers and gateways are killed with
kill -9 (or drained with SIGTERM) and restarted at random, PostgreSQL is stopped (``-m immediate``) for up to
twice the lease and started once, and once every gateway is killed at once for twice the lease (lease recovery,
docs/protocol.md), while runs with retries (``fail_attempts``) keep arriving. Then: every run succeeded, every
task succeeded, ``awp.check_invariants()`` is empty, and so was every sample taken while the chaos ran.

``AWP_CHAOS_SEED`` replays a sequence of actions (the seed is printed).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import time
from typing import Any

import httpx
import pytest
from fault_support import (
    LEASE_MS,
    InvariantSampler,
    configure,
    ms,
    own_cluster,
    query,
    record,
    violations,
)
from worker_support import WorkerProcess, Workers

from awp_testing.cluster import database_name, fresh_database
from awp_testing.gateway import ServeProcess, Tokens, start_serve, wait_until

pytestmark = pytest.mark.slow  # multi-process / long: make test-fast skips it

CHAOS_SECONDS = float(os.environ.get("AWP_CHAOS_SECONDS", "20"))
GATEWAYS = 2
WORKERS = 4
WORKER_CONCURRENCY = 3
TASKS_PER_RUN = 30


def definition(rng: random.Random, n: int) -> dict[str, Any]:
    """A DAG of three-deep chains with a few flaky tasks; enough attempts to survive the kills."""
    tasks = []
    for i in range(TASKS_PER_RUN):
        task: dict[str, Any] = {
            "key": f"t{i:02}",
            "executor": "mock",
            "action": "chaos",
            "input": {"sleep_ms": rng.randint(20, 400)},
            "depends_on": [f"t{i - 10:02}"] if i >= 10 else [],
            "retry": {"max_attempts": 30, "interval_ms": rng.choice([0, 50, 200])},
            "timeout_ms": 60000,
        }
        if rng.random() < 0.2:
            task["input"]["fail_attempts"] = 1
        tasks.append(task)
    return {"id": f"chaos-{n:03}", "concurrency": 6, "tasks": tasks}


class Chaos:
    """The processes under test and the random actions on them."""

    def __init__(self, dsn: str, rng: random.Random) -> None:
        self.dsn = dsn
        self.rng = rng
        self.tokens = Tokens()
        self.gateways: list[ServeProcess] = []
        self.down_until: dict[int, float] = {}  # gateway index -> when to restart it
        self.pools: list[Workers] = []
        self.slots: list[tuple[int, WorkerProcess]] = []  # (gateway index, process)
        self.counts = dict(
            worker_kills=0, worker_sigterms=0, worker_self_exits=0, gateway_kills=0, pg_restarts=0, all_gateways_down=0
        )
        self.runs: dict[str, dict[str, Any]] = {}  # idempotency key -> definition, until started
        self.run_ids: list[str] = []
        self._n = 0

    # -- processes --

    def start(self) -> None:
        for _ in range(GATEWAYS):
            gw = start_serve(self.dsn, tokens=self.tokens, coordinator_interval_ms=100)
            self.gateways.append(gw)
            self.pools.append(Workers(gw))
        for i in range(WORKERS):
            self.slots.append((i % GATEWAYS, self._worker(i % GATEWAYS)))

    def _worker(self, g: int) -> WorkerProcess:
        self._n += 1
        return self.pools[g].start(
            f"chaos-w{self._n}", concurrency=WORKER_CONCURRENCY, wait_ms=1000, shutdown_timeout=5.0
        )

    def close(self) -> None:
        for pool in self.pools:
            pool.__exit__(None, None, None)
        for gw in self.gateways:
            gw.kill()
            with contextlib.suppress(OSError):
                gw.log_path.unlink()

    def supervise(self) -> None:
        """Like a process manager: restart gateways whose downtime is over and workers that exited."""
        now = time.monotonic()
        for g, until in list(self.down_until.items()):
            if now >= until:
                old = self.gateways[g]
                self.gateways[g] = start_serve(
                    self.dsn, tokens=self.tokens, coordinator_interval_ms=100, port=old.port, wait_ready=False
                )
                del self.down_until[g]
        for i, (g, w) in enumerate(self.slots):
            if not w.alive():
                if w.proc.returncode not in (0, -signal.SIGKILL):
                    self.counts["worker_self_exits"] += 1
                self.slots[i] = (g, self._worker(g))

    # -- actions --

    def kill_worker(self) -> None:
        _, w = self.rng.choice(self.slots)
        w.kill()
        self.counts["worker_kills"] += 1

    def drain_worker(self) -> None:
        _, w = self.rng.choice(self.slots)
        w.signal(signal.SIGTERM)  # it drains and exits 0; supervise() replaces it once it has exited
        self.counts["worker_sigterms"] += 1

    def kill_gateway(self) -> None:
        live = [g for g in range(GATEWAYS) if g not in self.down_until]
        if not live:
            return
        g = self.rng.choice(live)
        self.gateways[g].kill()
        self.down_until[g] = time.monotonic() + self.rng.uniform(0.2, 1.5)
        self.counts["gateway_kills"] += 1

    def kill_all_gateways(self) -> None:
        """Every gateway killed at once for twice the lease (docs/protocol.md, Lease recovery)."""
        for g in range(GATEWAYS):
            if g not in self.down_until:
                self.gateways[g].kill()
            self.down_until[g] = time.monotonic() + 2 * LEASE_MS / 1000
        self.counts["all_gateways_down"] += 1

    # -- runs --

    def submit(self) -> None:
        """Start one more run (and retry those whose submission failed), through any live gateway."""
        key = f"chaos-{len(self.runs) + len(self.run_ids):03}"
        self.runs[key] = definition(self.rng, len(self.runs) + len(self.run_ids))
        for key, body in list(self.runs.items()):
            live = [gw for g, gw in enumerate(self.gateways) if g not in self.down_until]
            if not live:
                return
            gw = self.rng.choice(live)
            op = gw.auth("operator")
            try:
                r = httpx.post(gw.api("/workflows"), json=body, headers={**op, "Idempotency-Key": key}, timeout=5)
                if r.status_code not in (200, 201):
                    continue
                r = httpx.post(
                    gw.api(f"/workflows/{body['id']}/versions/1/runs"),
                    headers={**op, "Idempotency-Key": key},
                    timeout=5,
                )
                if r.status_code != 202:
                    continue
            except httpx.HTTPError:
                continue
            self.run_ids.append(r.json()["run_id"])
            del self.runs[key]


def test_chaos_soak() -> None:
    seed = int(os.environ.get("AWP_CHAOS_SEED") or time.time_ns() % 1_000_000)
    print(f"\n[chaos] seed {seed}, {CHAOS_SECONDS:.0f} s of chaos", flush=True)
    rng = random.Random(seed)
    with own_cluster() as cluster:
        name = database_name("chaos")
        dsn = fresh_database(cluster, name)
        query(dsn, f'ALTER DATABASE "{name}" SET synchronous_commit = on')
        configure(dsn)
        chaos = Chaos(dsn, rng)
        try:
            chaos.start()
            for _ in range(4):
                chaos.submit()
            pg_restart_at = time.monotonic() + CHAOS_SECONDS * rng.uniform(0.3, 0.6)
            all_down_at = time.monotonic() + CHAOS_SECONDS * rng.uniform(0.65, 0.85)
            end = time.monotonic() + CHAOS_SECONDS
            next_run = time.monotonic() + 2.0
            with InvariantSampler(dsn, interval=0.1) as sampler:
                while time.monotonic() < end:
                    time.sleep(rng.uniform(0.3, 1.0))
                    chaos.supervise()
                    now = time.monotonic()
                    if pg_restart_at and now >= pg_restart_at:
                        cluster.stop(mode="immediate")
                        time.sleep(rng.uniform(1.5, 2 * LEASE_MS / 1000))  # up to twice the lease
                        cluster.start(fsync=False)
                        chaos.counts["pg_restarts"] += 1
                        pg_restart_at = 0.0
                        continue
                    if all_down_at and now >= all_down_at:
                        chaos.kill_all_gateways()
                        all_down_at = 0.0
                        continue
                    action = rng.random()
                    if action < 0.45:
                        chaos.kill_worker()
                    elif action < 0.6:
                        chaos.drain_worker()
                    elif action < 0.85:
                        chaos.kill_gateway()
                    if now >= next_run:
                        chaos.submit()
                        next_run = now + 2.0
                # The chaos is over: everything comes back and the runs must all finish.
                calm = time.monotonic()

                def gateways_back() -> bool:
                    chaos.supervise()
                    return not chaos.down_until

                def submitted() -> bool:  # every run started, and at least 8 (a slow machine's chaos fits fewer)
                    if not chaos.runs and len(chaos.run_ids) >= 8:
                        return True
                    chaos.submit()
                    return not chaos.runs and len(chaos.run_ids) >= 8

                wait_until(gateways_back, 10, 0.1, "gateways back")
                for gw in chaos.gateways:
                    gw.wait_ready(30)
                wait_until(submitted, 30, 0.5, "submitted")

                def all_terminal() -> bool:
                    chaos.supervise()
                    left = query(
                        dsn,
                        "SELECT count(*) AS n FROM awp.runs WHERE status NOT IN ('succeeded', 'failed', 'canceled')",
                    )
                    return left[0]["n"] == 0

                wait_until(all_terminal, 180, 0.2, "every run to finish after the chaos")
                settled = time.monotonic() - calm
                sampled = sampler.stop()
        finally:
            chaos.close()

        runs = query(dsn, "SELECT status, count(*) AS n FROM awp.runs GROUP BY 1")
        tasks = query(dsn, "SELECT status, count(*) AS n FROM awp.tasks GROUP BY 1")
        tries = {r["status"]: r["n"] for r in query(dsn, "SELECT status, count(*) AS n FROM awp.attempts GROUP BY 1")}
        uncounted = query(dsn, "SELECT count(*) AS n FROM awp.attempts WHERE NOT counted")[0]["n"]  # lease recovery
        found = violations(dsn)
        total_runs = sum(r["n"] for r in runs)
        total_tasks = sum(t["n"] for t in tasks)
        assert total_runs == len(chaos.run_ids) and total_runs >= 8
        assert runs == [{"status": "succeeded", "n": total_runs}], f"lost or failed runs: {runs}"
        assert tasks == [{"status": "succeeded", "n": total_tasks}], f"lost or failed tasks: {tasks}"
        assert found == [], "invariant violations:\n" + "\n".join(map(str, found))
        assert sampled == [], "violations sampled during the chaos:\n" + "\n".join(map(str, sampled))
        record(
            "12_chaos_soak" + ("" if CHAOS_SECONDS < 45 else "_long"),
            seed=seed,
            chaos_seconds=CHAOS_SECONDS,
            gateways=GATEWAYS,
            workers=WORKERS,
            runs=total_runs,
            tasks=total_tasks,
            attempts=tries,
            attempts_not_counted=uncounted,
            **chaos.counts,
            settle_after_chaos_ms=ms(settled),
            invariant_samples=sampler.samples,
            sampler_connection_errors=sampler.errors,
            lost_tasks=0,
            violations=0,
        )
        cluster.drop_database(name)
