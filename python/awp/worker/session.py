"""The worker's session with the gateway (docs/protocol.md, The worker): registered once with the bootstrap
token, it gives the worker its id, its session token and the gateway's intervals; every loop of the worker shares
it, with its two ways to end: a drain (:attr:`Session.stopping`) and a fatal error (:meth:`Session.set_fatal`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from awp.handlers import registered_actions
from awp.worker.backoff import Backoff
from awp.worker.client import Client, GatewayError, TlsVerifyError, TransportError
from awp.worker.config import EXIT_CONFIG, EXIT_SESSION, Fatal, SessionInvalid, WorkerConfig
from awp.worker.ledger import Ledger

log = logging.getLogger("awp.worker")


class Session:
    """What the worker's loops share: the gateway's client, the session, the lease ledger, stop and fatal."""

    def __init__(self, config: WorkerConfig, client: Client, ledger: Ledger) -> None:
        self.config = config
        self.client = client
        self.ledger = ledger
        self.worker_id = ""
        self.session_token = ""
        self.heartbeat_interval_s = 5.0
        self.lease_duration_ms = 15000
        self.margin_ms = config.safety_margin_ms
        self.stopping = asyncio.Event()  # draining: claim nothing more, finish the leases in hand
        self.fatal: Fatal | None = None
        self.fatal_event = asyncio.Event()

    async def register(self, executors: list[str]) -> bool:
        """Register with the bootstrap token, retrying while the gateway is unreachable; False if stopped."""
        cfg = self.config
        backoff = Backoff(200, 5000)
        # Routing by action (docs/protocol.md): a python worker is given only the actions it has handlers for; the
        # mock executor runs every action (not listed).
        actions = {"python": registered_actions()} if "python" in executors else None
        while not self.stopping.is_set():
            try:
                answer = await self.client.register_worker(
                    cfg.bootstrap_token, cfg.name, executors, cfg.concurrency, actions
                )
            except TlsVerifyError as e:  # a configuration error, not an outage: waiting would not fix it
                raise Fatal(f"registration failed: {e}", EXIT_CONFIG) from e
            except TransportError as e:
                delay = backoff.next_delay()
                log.warning("gateway unreachable (%s); retrying registration in %.1fs", e, delay)
            except GatewayError as e:
                if e.status == 401:
                    raise Fatal(f"registration rejected: {e.code} (is the bootstrap token right?)", EXIT_CONFIG) from e
                if not e.retryable:
                    raise Fatal(f"registration failed: {e}", EXIT_CONFIG) from e
                delay = backoff.next_delay()
                log.warning("registration failed (%s); retrying in %.1fs", e, delay)
            else:
                self.worker_id = answer["worker_id"]
                self.session_token = answer["session_token"]
                self.heartbeat_interval_s = int(answer["heartbeat_interval_ms"]) / 1000.0
                self.lease_duration_ms = int(answer["lease_duration_ms"])
                self.margin_ms = max(0, min(cfg.safety_margin_ms, self.lease_duration_ms // 2))
                log.info(
                    "registered as %s (%s): executors %s%s, concurrency %d, heartbeat %dms, lease %dms, margin %dms",
                    self.worker_id,
                    cfg.name,
                    ",".join(executors),
                    f" (python actions: {', '.join(actions['python']) or 'none'})" if actions else "",
                    cfg.concurrency,
                    int(answer["heartbeat_interval_ms"]),
                    self.lease_duration_ms,
                    self.margin_ms,
                )
                return True
            await self.sleep_unless_stopping(delay)
        return False

    async def sleep_unless_stopping(self, delay: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stopping.wait(), delay)

    def set_fatal(self, exc: BaseException) -> None:
        """The worker exits (the first reason wins): every execution is aborted, none is completed."""
        if self.fatal is not None:
            return
        if isinstance(exc, SessionInvalid):
            self.fatal = Fatal(f"session invalid ({exc}): cancelled local work; exiting", EXIT_SESSION)
        elif isinstance(exc, Fatal):
            self.fatal = exc
        else:
            self.fatal = Fatal(f"unexpected error: {exc!r}", 1)
        self.ledger.abort_all("worker session invalid")
        self.fatal_event.set()
