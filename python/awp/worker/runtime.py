"""The worker runtime (docs/protocol.md, The worker): one asyncio process with a claim loop, a heartbeat loop, a
completer and one asyncio task per active lease. :class:`Worker` wires them: its session, its signals, its run
loop; :func:`run_worker` is ``awp worker``.

The pieces, along the protocol's nouns: :mod:`awp.worker.config` (the configuration, exit codes),
:mod:`awp.worker.session` (registration, the session every loop shares, stop and fatal), :mod:`awp.worker.ledger`
(the leases in hand, claim numbering, dropped leases), :mod:`awp.worker.claims` (the claim loop),
:mod:`awp.worker.executions` (an execution's deadlines, running its executor, hung handlers),
:mod:`awp.worker.completer` (results, a single one being a batch of one), :mod:`awp.worker.heartbeats` and
:mod:`awp.worker.drain` (drain and shutdown)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import threading
import time

from awp import eventloop
from awp.protocol.wire import Lease
from awp.worker.claims import Claims
from awp.worker.client import Client, client_ssl_context
from awp.worker.completer import Completer
from awp.worker.config import EXIT_CONFIG, EXIT_HUNG, EXIT_OK, EXIT_SIGNAL, Fatal, SessionInvalid, WorkerConfig
from awp.worker.drain import Drain
from awp.worker.executions import Execution, Runner
from awp.worker.executors import HANDLER_THREAD_PREFIX, Executor, build_executors
from awp.worker.heartbeats import Heartbeats
from awp.worker.ledger import Ledger
from awp.worker.progress import ProgressSender
from awp.worker.session import Session

__all__ = ["Worker", "WorkerConfig", "run_worker"]

log = logging.getLogger("awp.worker")


class Worker:
    def __init__(self, config: WorkerConfig, executors: dict[str, Executor] | None = None) -> None:
        self.config = config
        self.executors = (
            executors if executors is not None else build_executors(config.executors, config.handler_modules)
        )
        self.client = Client(config.gateway, timeout_s=30.0, ca_file=config.ca_file)
        self.ledger = Ledger()
        self.session = Session(config, self.client, self.ledger)
        # Live output of the handlers (ctx.progress / ctx.log / ctx.emit; docs/progress.md), batched per worker.
        self.output = ProgressSender(self.client, lambda: self.session.worker_id, lambda: self.session.session_token)
        self.runner = Runner(self.executors, self.output, config.concurrency, self.ledger.slot_freed)
        self.heartbeats = Heartbeats(self.session)
        self.claims = Claims(self.session, self.runner, self._start)
        self.completer = Completer(self.session, self.heartbeats, self._start)
        self.drain = Drain(self.session, self.runner)
        self._signals = 0
        self._claim_task: asyncio.Task[None] | None = None

    # ---- entry point -------------------------------------------------------------------------------------

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, self._on_signal, sig)
        try:
            code = await self._run()
        finally:
            self.runner.exiting = True
            await self.output.close()
            await self.client.close()
        self._log_summary(code)
        return code

    def _log_summary(self, code: int) -> None:
        """One line when the worker exits: its exit code, its results and its hung handlers."""
        hung = ", ".join(f"{action} ({where})" for where, action in self.runner.hung.values())
        log.log(
            logging.WARNING if code else logging.INFO,
            "worker %s exiting with code %d: %d result(s) acknowledged, %d refused by the server and reported as"
            " result_rejected, %d handler(s) hung (%d still running%s)",
            self.session.worker_id or self.config.name,
            code,
            self.completer.acknowledged,
            self.completer.rejected,
            self.runner.hung_total,
            len(self.runner.hung),
            f": {hung}" if hung else "",
        )

    def _on_signal(self, sig: signal.Signals) -> None:
        self._signals += 1
        if self._signals > 1:
            log.warning("second %s: exiting at once", sig.name)
            logging.shutdown()
            os._exit(EXIT_SIGNAL)
        log.info(
            "%s received: draining (stop claiming, finish %d active lease(s))", sig.name, len(self.ledger.executions)
        )
        self.session.stopping.set()

    async def _run(self) -> int:
        session = self.session
        try:
            registered = await session.register(list(self.executors))
        except Fatal as e:
            log.error("%s", e)
            return e.exit_code
        if not registered:
            log.info("stopped before registering")
            return EXIT_OK
        heartbeat = asyncio.create_task(self.heartbeats.loop(), name="heartbeat")
        self._claim_task = asyncio.create_task(self.claims.loop(), name="claim")
        completer = asyncio.create_task(self.completer.loop(), name="completer")
        stop_wait = asyncio.create_task(session.stopping.wait())
        fatal_wait = asyncio.create_task(session.fatal_event.wait())
        try:
            await asyncio.wait({stop_wait, fatal_wait}, return_when=asyncio.FIRST_COMPLETED)
            if session.fatal is None:
                await self.drain.run(self._claim_task)
        finally:
            for t in (stop_wait, fatal_wait, heartbeat, self._claim_task):
                t.cancel()
            await self.ledger.cancel_all("worker is exiting")
            completer.cancel()
            for t in (heartbeat, self._claim_task, completer):
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await t
        if session.fatal is not None:
            log.error("%s", session.fatal)
            return session.fatal.exit_code
        if self.runner.hung:
            log.error(
                "%d hung handler(s) still running at the end of the drain: exiting with code %d (restart this worker)",
                len(self.runner.hung),
                EXIT_HUNG,
            )
            return EXIT_HUNG
        return EXIT_OK

    # ---- one lease ---------------------------------------------------------------------------------------

    def _start(self, lease: Lease, received_at: float) -> None:
        ex = Execution(lease, received_at)
        lease_ms = max(0, int(lease["lease_remaining_ms"]))
        ex.set_margin(min(self.session.margin_ms, lease_ms // 2))
        self.ledger.start(ex)
        log.info(
            "claimed %s: %s/%s, fencing %s, %.0fms to local deadline",
            ex.describe(),
            lease.get("executor_kind"),
            lease.get("action"),
            lease.get("fencing_token"),
            (ex.deadline - time.monotonic()) * 1000,
        )
        ex.task = asyncio.create_task(self._execute(ex), name=f"lease-{ex.dispatch_id}")

    async def _execute(self, ex: Execution) -> None:
        leases: list[Lease] = []
        try:
            result = await self.runner.run(ex)
            if result is not None and ex.abort_reason is None:
                leases = await self.completer.complete(ex, result)
        except SessionInvalid as e:
            self.session.set_fatal(e)
        except Exception as e:
            log.exception("lease %s: unexpected error", ex.describe())
            self.session.set_fatal(e)
        finally:
            self.ledger.end(ex)  # with no result acknowledged, the next heartbeats report the lease dropped
            # Leases that rode on the completion take over this slot at once; otherwise the claim loop wakes.
            received_at = time.monotonic()
            for lease in leases:
                self._start(lease, received_at)
            if not leases:
                self.ledger.slot_freed.set()


def run_worker(config: WorkerConfig) -> int:
    """Run a worker until drained or failed; returns the process exit code."""
    try:
        worker_executors = build_executors(config.executors, config.handler_modules, config.concurrency)
        client_ssl_context(config.ca_file)  # an unreadable --ca-file fails here, not in the event loop
    except (ValueError, ImportError, OSError) as e:  # ssl.SSLError is an OSError
        log.error("bad configuration: %s", e)
        return EXIT_CONFIG

    async def main() -> int:
        return await Worker(config, worker_executors).run()

    try:
        code = eventloop.run(main())
    except KeyboardInterrupt:
        code = EXIT_SIGNAL
    stuck = [t.name for t in threading.enumerate() if t.name.startswith(HANDLER_THREAD_PREFIX) and t.is_alive()]
    if stuck:  # cancelled sync handlers still running: a thread cannot be stopped, so do not wait for it
        log.warning("%d sync handler thread(s) still running; exiting without waiting for them", len(stuck))
        logging.shutdown()
        os._exit(code)
    return code
