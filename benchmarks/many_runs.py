"""Issue 46 in ``make bench``: many runs at once (step 9 of ``run.py``, after retention; ``run.py --many-runs-only``
runs these alone, ``--quick`` at reduced sizes). Same cluster, same ``awp serve``, real ``awp worker`` processes
(``many_workers`` = 4, ``--concurrency 1``, executor ``mock``, ``sleep_ms`` 0), in order:

a. many runs: N runs x M tasks (1,000 x 10, run concurrency 4; 10,000 x 1), all started in one transaction
   (``awp.start_runs``, 1,000 a call), timed from its commit (database clock) to the last run's end. Their rounds
   alternate with one run of ``many_base_tasks`` (1,000) started and timed the same way (base, 1,000 x 10, 10,000 x
   1, then backwards, ...): that run's median is the base of the targets (>= 0.8 x and >= 0.6 x), measured in the
   same minutes (this machine drifts by 20% within minutes); the report also gives the ratio to step 2's median.
   CPU is counted from the commit (the start transaction's own time and PostgreSQL CPU are given apart).
b. backlog: ``backlog_runs`` x ``backlog_tasks`` (1,000 x 100 = 100,000) ready tasks of executor ``python``, which
   no worker serves, started in one transaction; the same small workload measured before it exists, while it
   exists, and after it is canceled (``awp.cancel_waiting_runs('python', 1000)`` until it returns 0): idle claims
   (1-task runs one at a time: submit -> claimed, as step 5) and one run of ``many_base_tasks`` (tasks/s, PostgreSQL
   CPU per task, dispatch -> claim per task). The empty-queue figures pool the before and after phases.
c. coordinator pass: ``pass_runs`` (10,000) live 1-task runs of executor ``python`` (nothing to dispatch: the 4
   idle ``mock`` workers have free slots, no worker serves ``python``); ``SELECT awp.coordinator_tick(false, NULL,
   false)`` (the gateway's pass between its limits reports) ``pass_samples`` times from this harness, each in its
   own transaction: p50 of the statement + its commit (the target) and of the statement alone; the 2-argument form
   (which also computes "limited") a fifth as often; the same with the workers stopped (no free slot of any kind),
   and with no live run, for reference; and the gateway's own passes meanwhile (its /metrics histogram).
d. logging: one run of ``many_base_tasks`` on the 4 workers, ``log_pairs`` pairs of repetitions alternating
   (INFO, WARNING, WARNING, INFO, ...): INFO is the default of ``awp serve`` and ``awp worker``; WARNING is
   ``awp worker --log-level warning`` and, as ``awp serve`` has no such option, the gateway started through a
   wrapper that sets its ``awp`` loggers to WARNING (``procs._SERVE_AT_LEVEL``). The gateway and the workers are
   restarted before every repetition (both levels alike), then an untimed warm-up run.
e. run starts through HTTP: ``start_clients`` (8, then 1) concurrent clients (asyncio + aiohttp in this process,
   one kept connection each) POST ``/api/v1/workflows/{id}/versions/1/runs`` (operator token, a new
   Idempotency-Key per request, body ``{}``) of a 1-task workflow for ``start_seconds`` each, workers stopped
   (starts only); runs/s of 202 answers. Then every run so started is canceled (``awp.cancel_waiting_runs``).

Each scenario ends with ``awp.check_invariants()`` over its own runs (``Bench.invariants_of``: 1,000 runs a call;
a whole-database call costs runs x tasks here); a failed scenario is recorded (``status: failed``) and the others
still run.

The scenarios a and d are in ``many_load.py``, b, c and e (runs no worker serves) in ``many_idle.py``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from many_idle import backlog, coordinator_pass, http_starts
from many_load import logging_cost, restart, throughput

if TYPE_CHECKING:
    from harness import Bench
    from plans import Plan

log = logging.getLogger("bench")


# ---- all of them ------------------------------------------------------------------------------------------

SCENARIOS: tuple[tuple[str, Callable[[Bench, Plan], dict[str, Any]]], ...] = (
    ("throughput", throughput),
    ("backlog", backlog),
    ("coordinator_pass", coordinator_pass),
    ("logging", logging_cost),
    ("starts", http_starts),
)


def recover(b: Bench) -> None:
    """After a failed scenario: no worker, the gateway restarted at its defaults, every live run canceled."""
    with_errors: list[str] = []
    for step in (
        lambda: restart(b, None),
        lambda: b.conn.execute(
            "SELECT count(awp.request_cancel(run_id)) FROM awp.runs WHERE status IN ('pending', 'running')"
        ),
    ):
        try:
            step()
        except Exception as exc:
            with_errors.append(f"{type(exc).__name__}: {exc}")
    if with_errors:
        log.error("  recovery after a failed scenario: %s", "; ".join(with_errors))


def measure(b: Bench, plan: Plan) -> dict[str, Any]:
    """Every scenario of issue 46, in order; one that fails is recorded as failed and the next still runs."""
    out: dict[str, Any] = {}
    for key, scenario in SCENARIOS:
        started = time.monotonic()
        log.info("issue 46, %s", key.replace("_", " "))
        try:
            out[key] = scenario(b, plan)
        except Exception as exc:
            log.exception("issue 46, %s: FAILED", key)
            out[key] = {"label": key.replace("_", " "), "status": "failed", "error": f"{type(exc).__name__}: {exc}"}
            recover(b)
        out[key]["elapsed_s"] = round(time.monotonic() - started, 1)
    return out
