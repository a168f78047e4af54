"""The claim loop (docs/protocol.md, Claims): while the worker has a free slot, ask for that many leases (a
long-poll of ``wait_ms``) and start each one at once; back off while the gateway does not answer or has nothing."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from awp.protocol.wire import Lease
from awp.worker.backoff import Backoff, retry_after_of
from awp.worker.client import GatewayError, TransportError
from awp.worker.config import SESSION_INVALID, SessionInvalid
from awp.worker.executions import Runner
from awp.worker.session import Session

log = logging.getLogger("awp.worker")


class Claims:
    """Claims leases for the free slots and hands each to ``start(lease, received_at)``."""

    def __init__(self, session: Session, runner: Runner, start: Callable[[Lease, float], None]) -> None:
        self.session = session
        self.runner = runner
        self.start = start

    def free_slots(self) -> int:
        """Slots neither running a lease nor held by a hung handler."""
        return self.session.config.concurrency - len(self.session.ledger.executions) - len(self.runner.hung)

    async def loop(self) -> None:
        s, ledger = self.session, self.session.ledger
        cfg = s.config
        backoff = Backoff(cfg.backoff_min_ms, cfg.backoff_max_ms)
        try:
            while not s.stopping.is_set():
                free = self.free_slots()
                if free <= 0:
                    ledger.slot_freed.clear()
                    if self.free_slots() <= 0:
                        await ledger.slot_freed.wait()
                    continue
                sent_at = time.monotonic()
                seq = ledger.claim_begin()
                try:
                    leases = await s.client.claim(s.worker_id, s.session_token, free, cfg.wait_ms, claim_seq=seq)
                    # A long-poll may hold the request for seconds before the lease is issued, so durations are
                    # measured from the answer; the safety margin absorbs the answer's one-way latency.
                    received_at = time.monotonic()
                except (TransportError, GatewayError) as e:
                    ledger.claim_end(seq)  # ended without an answer: a lease it granted is one we never got
                    if isinstance(e, GatewayError) and e.code == SESSION_INVALID:
                        if not s.stopping.is_set():
                            raise SessionInvalid(e.message) from e
                        return
                    if isinstance(e, GatewayError) and e.code == "worker_draining":
                        if not s.stopping.is_set():  # not our own drain (SIGTERM): an operator's
                            log.info("the gateway says this worker is draining (drained by an operator): draining")
                        s.stopping.set()
                        return
                    delay = backoff.next_delay(retry_after_of(e))
                    level = (
                        logging.DEBUG
                        if isinstance(e, GatewayError) and e.code == "worker_capacity_exceeded"
                        else logging.WARNING
                    )
                    log.log(level, "claim failed (%s); retrying in %.2fs", e, delay)
                    await s.sleep_unless_stopping(delay)
                    continue
                ledger.claim_end(seq)  # its leases start right below, before anything else can run
                if leases:
                    backoff.reset()
                    for lease in leases:
                        self.start(lease, received_at)
                    continue
                elapsed_ms = (time.monotonic() - sent_at) * 1000
                if cfg.wait_ms == 0 or elapsed_ms < cfg.wait_ms / 2:  # no long-poll (or it ended early): back off
                    await s.sleep_unless_stopping(backoff.next_delay())
                else:
                    backoff.reset()
        except SessionInvalid as e:
            self.session.set_fatal(e)
        except Exception as e:  # a bug: exit loudly rather than idle forever without claiming
            log.exception("claim loop failed")
            self.session.set_fatal(e)
