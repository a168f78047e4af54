"""The executions: one :class:`Execution` per active lease, its deadlines on the worker's own clock, and the
:class:`Runner` that runs its executor, watches it and notices a handler that does not return.

Ownership is the server's: the worker only knows *durations* (``lease_remaining_ms``) and measures them with
its own monotonic clock from the moment it sent the request, never comparing wall clocks. Each lease gets a
local safety deadline = lease end - safety margin (capped at half the lease), pushed forward by each
``renewed`` heartbeat but never past the attempt deadline. When the deadline passes, or a heartbeat answers
``revoked``/``unknown``, the execution is cancelled and never completed: someone else may own it now.

A slot is free only once its handler has returned: a handler that does not return when its execution is
cancelled (a sync handler's thread cannot be interrupted) keeps its slot, and a worker whose every slot holds a
hung handler claims nothing and says so once (docs/operations.md, Hung handlers)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from datetime import datetime
from typing import Any

from awp.handlers import Context
from awp.protocol.results import check_result, failure
from awp.protocol.wire import Lease, OutputWrite, Result
from awp.worker.config import EXIT_HUNG
from awp.worker.executors import Executor
from awp.worker.progress import ProgressSender

log = logging.getLogger("awp.worker")

# How long a cancelled handler may take to return before its slot counts as held by a hung handler.
HUNG_GRACE_S = 1.0


def duration_s(start: Any, end: Any) -> float:
    """``end - start`` in seconds for two ISO timestamps from the server (0 when unknown)."""
    try:
        a = datetime.fromisoformat(str(start).replace("Z", "+00:00"))
        b = datetime.fromisoformat(str(end).replace("Z", "+00:00"))
    except (TypeError, ValueError):
        return 0.0
    return max(0.0, (b - a).total_seconds())


class Execution:
    """One active lease: its deadlines (monotonic seconds), its task and why it was aborted, if it was."""

    def __init__(self, lease: Lease, claimed_at: float) -> None:
        self.lease = lease
        self.dispatch_id: str = lease["dispatch_id"]
        self.lease_token: str = lease["lease_token"]
        self.run_id: str = lease["run_id"]
        self.task_key: str = lease["task_key"]
        self.attempt: int = int(lease["attempt"])
        remaining_s = max(0, int(lease["lease_remaining_ms"])) / 1000.0
        # The attempt deadline as a duration after the lease's end (two server timestamps: only their difference
        # is used), added to the lease's remaining time, measured on our monotonic clock from ``claimed_at``.
        after_lease_s = duration_s(lease.get("lease_expires_at"), lease.get("attempt_deadline"))
        self.attempt_deadline = claimed_at + remaining_s + after_lease_s
        self.margin_s = 0.0
        self.deadline = claimed_at + remaining_s
        self.abort_reason: str | None = None
        self.aborted = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        self.settled = False  # the server acknowledged its result (else, once it ends, it is reported dropped)
        self.live_output: list[OutputWrite] = []  # its last progress writes, sent with its result (docs/progress.md)

    def set_margin(self, margin_ms: int) -> None:
        """Apply the safety margin once, at claim time (the caller caps it at half the lease)."""
        self.margin_s = margin_ms / 1000.0
        self.deadline = min(self.deadline - self.margin_s, self.attempt_deadline - self.margin_s)

    def renew(self, lease_remaining_ms: int, sent_at: float) -> None:
        candidate = min(sent_at + lease_remaining_ms / 1000.0, self.attempt_deadline) - self.margin_s
        if candidate > self.deadline:
            self.deadline = candidate

    def abort(self, reason: str) -> None:
        if self.abort_reason is None:
            self.abort_reason = reason
        self.aborted.set()

    def expired(self, now: float) -> bool:
        """Whether the server's lease has surely ended: it ends at most one margin after our local deadline."""
        return now > self.deadline + self.margin_s + 1.0

    def describe(self) -> str:
        return f"{self.run_id}/{self.task_key}#{self.attempt} (dispatch {self.dispatch_id})"


class Runner:
    """Runs an execution's executor until it returns, its local deadline passes or it is aborted; a handler that
    does not return when cancelled is recorded in :attr:`hung` and keeps its slot until it does."""

    def __init__(
        self, executors: dict[str, Executor], output: ProgressSender, concurrency: int, slot_freed: asyncio.Event
    ) -> None:
        self.executors = executors
        self.output = output
        self.concurrency = concurrency
        self.slot_freed = slot_freed
        # Handlers that did not return when cancelled: dispatch id -> (description, action). Each keeps its slot.
        self.hung: dict[str, tuple[str, str]] = {}
        self.hung_total = 0
        self.exiting = False  # the worker is exiting: a hung handler's task ends with the event loop
        self._all_hung_warned = False

    async def run(self, ex: Execution) -> Result | None:
        """The result to report, or None when there is none to send (aborted, cancelled)."""
        lease = ex.lease
        executor = self.executors.get(str(lease.get("executor_kind")))
        if executor is None:
            return failure(
                "permanent_failure", "unknown_executor", f"this worker has no executor {lease.get('executor_kind')!r}"
            )
        ctx = Context(
            run_id=ex.run_id,
            task_key=ex.task_key,
            attempt=ex.attempt,
            fencing_token=int(lease.get("fencing_token") or 0),
            workflow_id=str(lease.get("workflow_id", "")),
            action=str(lease.get("action", "")),
            deadline=ex.attempt_deadline - ex.margin_s,
            run_input=lease.get("run_input") or {},
            upstream=lease.get("upstream") or {},
            item=lease.get("item"),
            item_index=lease.get("item_index"),
            _deadline_fn=lambda: ex.deadline,
            _output=(output := self.output.open(ex.dispatch_id, ex.lease_token)),
        )
        work = asyncio.create_task(executor.execute(ctx.action, lease.get("input"), ctx))
        aborted: asyncio.Task[Any] | None = None
        try:
            # A handler that returns without waiting is done after one turn of the loop: then no watcher is needed
            # (one task and one asyncio.wait less per lease); otherwise watch for the deadline and an abort.
            await asyncio.sleep(0)
            while True:
                remaining = ex.deadline - time.monotonic()
                if remaining <= 0:
                    ex.abort("local safety deadline passed")
                    break
                if work.done() or ex.aborted.is_set():
                    break
                if aborted is None:
                    aborted = asyncio.create_task(ex.aborted.wait())
                done, _ = await asyncio.wait({work, aborted}, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
                if work in done or aborted in done:
                    break
        finally:
            if aborted is not None:
                aborted.cancel()
            if not work.done():
                work.cancel()
                await asyncio.wait({work}, timeout=HUNG_GRACE_S)
                if work.done():
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await work
                else:  # recorded before the execution frees the lease's slot: the hung handler keeps it
                    self._handler_hung(ex, work)
        if ex.abort_reason is not None:
            self.output.discard(output)
            log.warning("lease %s: %s; execution cancelled, not completing", ex.describe(), ex.abort_reason)
            return None
        ex.live_output = await self.output.finish(output)  # sent with the result, written before it (docs/progress.md)
        try:
            result = work.result()
        except asyncio.CancelledError:
            return None
        except Exception as e:
            log.warning("lease %s: executor error %r", ex.describe(), e)
            result = failure("temporary_failure", "executor_error", repr(e))
        return check_result(result)

    def _handler_hung(self, ex: Execution, work: asyncio.Task[Any]) -> None:
        """A cancelled handler that has not returned keeps its slot until it does (docs/operations.md)."""
        action = str(ex.lease.get("action", ""))
        self.hung[ex.dispatch_id] = (ex.describe(), action)
        self.hung_total += 1
        since = time.monotonic()
        log.warning(
            "lease %s: handler %r has not returned %.1fs after it was cancelled (%s); its slot stays taken until it"
            " does (%d of %d slot(s) hold hung handlers)",
            ex.describe(),
            action,
            HUNG_GRACE_S,
            ex.abort_reason,
            len(self.hung),
            self.concurrency,
        )
        if len(self.hung) >= self.concurrency and not self._all_hung_warned:
            self._all_hung_warned = True
            log.warning(
                "every slot (%d of %d) holds a hung handler: this worker claims nothing until one returns; restart it"
                " (on SIGTERM it exits with code %d at the end of its drain deadline)",
                len(self.hung),
                self.concurrency,
                EXIT_HUNG,
            )
        work.add_done_callback(lambda _: self._hung_returned(ex, since))

    def _hung_returned(self, ex: Execution, since: float) -> None:
        if self.exiting:  # the event loop is closing: this is its cancellation, not the handler's return
            return
        self.hung.pop(ex.dispatch_id, None)
        self._all_hung_warned = False
        log.info(
            "lease %s: the hung handler returned %.1fs later; its slot is free again",
            ex.describe(),
            time.monotonic() - since,
        )
        self.slot_freed.set()
