"""Drain and shutdown (docs/protocol.md, Drain): on SIGTERM/SIGINT or an operator's drain, the worker tells the
gateway (which hands it nothing more), finishes its active leases within ``shutdown_timeout_s``, then cancels what
is left and releases those leases, so their tasks are due again at once on another worker."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from awp.worker.backoff import Backoff
from awp.worker.client import GatewayError, TransportError
from awp.worker.config import SESSION_INVALID, SessionInvalid
from awp.worker.executions import Execution, Runner
from awp.worker.session import Session

log = logging.getLogger("awp.worker")


class Drain:
    def __init__(self, session: Session, runner: Runner) -> None:
        self.session = session
        self.runner = runner
        self.stopped = False  # the gateway answered the drain with the worker stopped

    async def run(self, claim_task: asyncio.Task[None] | None) -> None:
        """Drain; ``claim_task``: the claim loop, whose request in flight may still hand the worker leases."""
        s, ledger = self.session, self.session.ledger
        timeout = s.config.shutdown_timeout_s
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        summary = await self._call(end)
        if s.fatal_event.is_set():
            return
        if summary is not None:
            log.info("drain: worker %s is %s", s.worker_id, summary.get("status"))
            if summary.get("status") == "stopped":
                self.stopped = True
        # An in-flight claim may still hand us leases (committed before the drain): wait for its answer.
        if claim_task is not None and not claim_task.done():
            with contextlib.suppress(TimeoutError, asyncio.CancelledError, Exception):
                await asyncio.wait_for(asyncio.shield(claim_task), max(0.0, end - loop.time()))
        while (ledger.executions or self.runner.hung) and loop.time() < end and not s.fatal_event.is_set():
            ledger.slot_freed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(ledger.slot_freed.wait(), max(0.01, end - loop.time()))
        if s.fatal_event.is_set():
            return
        if ledger.executions:
            abandoned = list(ledger.executions.values())
            log.warning(
                "shutdown timeout (%.1fs) passed with %d active lease(s): cancelling and releasing them",
                timeout,
                len(abandoned),
            )
            await ledger.cancel_all("shutdown timeout passed")
            await self._release_all([ex for ex in abandoned if not ex.settled], max(end, loop.time() + 5.0))
        if not self.stopped:
            summary = await self._call(max(end, loop.time() + 5.0))
            if summary is not None:
                self.stopped = summary.get("status") == "stopped"
                log.info("drain: worker %s is %s", s.worker_id, summary.get("status"))

    async def _call(self, end: float) -> dict[str, Any] | None:
        """``POST .../drain``, retried until ``end``; its answer, or None."""
        s = self.session
        loop = asyncio.get_running_loop()
        backoff = Backoff(100, 1000)
        while True:
            try:
                return await s.client.drain(s.worker_id, s.session_token)
            except GatewayError as e:
                if e.code == SESSION_INVALID:  # e.g. marked offline while the gateway was unreachable
                    s.set_fatal(SessionInvalid(e.message))
                    return None
                if not e.retryable:
                    log.error("drain failed: %s", e)
                    return None
                reason = str(e)
            except TransportError as e:
                reason = str(e)
            delay = backoff.next_delay()
            if loop.time() + delay > end:
                log.warning("drain failed (%s); giving up", reason)
                return None
            log.warning("drain failed (%s); retrying in %.2fs", reason, delay)
            await asyncio.sleep(delay)

    async def _release_all(self, abandoned: list[Execution], end: float) -> None:
        """Give back the leases the drain abandoned (docs/protocol.md, Drain): each task is due again at once, on
        another worker, its attempt not counted against max_attempts. A lease that cannot be released by ``end``
        (the gateway is unreachable) ends at its expiry as before."""
        s = self.session
        loop = asyncio.get_running_loop()
        for ex in abandoned:
            backoff = Backoff(100, 1000)
            while True:
                try:
                    answer = await s.client.release(s.worker_id, s.session_token, ex.dispatch_id, ex.lease_token)
                except GatewayError as e:
                    if not e.retryable:  # lease_lost: completed, expired or canceled meanwhile; nothing to give back
                        log.info("lease %s: not released (%s: %s)", ex.describe(), e.code, e.message)
                        break
                    reason = str(e)
                except TransportError as e:
                    reason = str(e)
                else:
                    s.ledger.released(ex.dispatch_id)  # released: nothing left to report
                    log.info(
                        "released %s: its task is %s, due again at once (this attempt does not count)",
                        ex.describe(),
                        answer.get("task_status"),
                    )
                    break
                delay = backoff.next_delay()
                if loop.time() + delay > end:
                    log.warning("lease %s: release failed (%s); it ends at its expiry", ex.describe(), reason)
                    break
                await asyncio.sleep(delay)
