"""The status names of runs and tasks (db/migrations/0001_schema.sql; docs/protocol.md, State machines) that
the terminal (:mod:`awp.cli.terminal`), the dashboard (:mod:`awp.server.ui`) and the metrics show, in display order."""

from __future__ import annotations

RUN_STATUSES = ("pending", "running", "succeeded", "failed", "canceled")
LIVE_RUN = frozenset({"pending", "running"})
RUN_TERMINAL = frozenset({"succeeded", "failed", "canceled"})

TASK_STATUSES = (
    "succeeded",
    "running",
    "queued",
    "ready",
    "waiting_retry",
    "waiting_dependencies",
    "failed",
    "skipped",
    "canceled",
)
TASK_DONE = frozenset({"succeeded", "failed", "skipped", "canceled"})
WAITING_TASK = frozenset({"waiting_dependencies", "waiting_retry", "ready", "queued"})
