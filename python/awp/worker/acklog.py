"""``AWP_WORKER_ACK_LOG=PATH`` makes the worker append one JSON line per completion the gateway acknowledged
(``{"dispatch_id", "run_id", "task_key", "attempt", "fencing_token", "kind", "applied"}``), written after the
answer arrived: tests use it to prove that no acknowledged result is lost (e.g. across a database failover)."""

from __future__ import annotations

import json
import logging
import os

from awp.protocol.wire import Result
from awp.worker.executions import Execution

log = logging.getLogger("awp.worker")


class AckLog:
    def __init__(self, path: str | None = None) -> None:
        self.path = path if path is not None else (os.environ.get("AWP_WORKER_ACK_LOG") or None)

    def record(self, ex: Execution, result: Result, applied: bool) -> None:
        """Append an acknowledged completion (when the log is set)."""
        if self.path is None:
            return
        line = json.dumps(
            {
                "dispatch_id": ex.dispatch_id,
                "run_id": ex.run_id,
                "task_key": ex.task_key,
                "attempt": ex.attempt,
                "fencing_token": ex.lease.get("fencing_token"),
                "kind": result.get("kind"),
                "applied": applied,
            }
        )
        try:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(line + "\n")
        except OSError as e:  # a test aid: never let it break a worker
            log.warning("cannot append to AWP_WORKER_ACK_LOG %s: %s", self.path, e)
