"""The heartbeat loop (docs/protocol.md, Heartbeats): every interval, one request lists the leases held, the claim
requests that have ended and the leases dropped; each answer renews a lease (its local deadline moves forward) or
revokes it (its execution is aborted and never completed). An operator's drain arrives here too."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from awp.worker.client import ClientError, GatewayError
from awp.worker.config import SESSION_INVALID, SessionInvalid
from awp.worker.session import Session

log = logging.getLogger("awp.worker")


class Heartbeats:
    def __init__(self, session: Session) -> None:
        self.session = session
        self.ok = 0  # successful heartbeats so far (a held result waits for one after an outage)
        self._ok_event = asyncio.Event()  # set (and replaced) at each successful heartbeat
        self._failures = 0  # failures in a row

    async def loop(self) -> None:
        interval = self.session.heartbeat_interval_s
        try:
            while True:
                sent_at = time.monotonic()
                await self.once(sent_at, timeout_s=max(1.0, 2 * interval))
                delay = interval - (time.monotonic() - sent_at)
                if delay > 0:
                    await asyncio.sleep(delay)
        except SessionInvalid as e:
            self.session.set_fatal(e)
        except Exception as e:  # a bug: exit loudly rather than let every lease expire silently
            log.exception("heartbeat loop failed")
            self.session.set_fatal(e)

    async def once(self, sent_at: float, timeout_s: float) -> None:
        s, ledger = self.session, self.session.ledger
        # Lease recovery (docs/protocol.md): every lease held (running, its result being sent, or received and not
        # started yet) is listed; claimed_through and claims_pending say which claim requests have ended, so the
        # server releases a lease those gave us that we do not list (a lost answer). Composed in one go (no await):
        # a request that ends after this is still pending here, so no lease of its answer can be released by it.
        active = list(ledger.executions.values())
        leases = ledger.held()
        dropped = ledger.dropped_refs()
        try:
            answers, worker_status = await s.client.heartbeat(
                s.worker_id,
                s.session_token,
                leases,
                timeout_s=timeout_s,
                claimed_through=ledger.claim_seq,
                claims_pending=sorted(ledger.claims_pending),
                dropped=dropped,
            )
        except GatewayError as e:
            if e.code == SESSION_INVALID:
                if s.stopping.is_set():  # our own drain may have just stopped it: the drain call decides
                    return
                raise SessionInvalid(e.message) from e
            self._failed(e)
            return
        except ClientError as e:
            self._failed(e)
            return
        if self._failures:
            log.info("heartbeat recovered after %d failure(s)", self._failures)
            self._failures = 0
        ledger.reported(dropped)
        self.ok += 1
        self._ok_event.set()
        self._ok_event = asyncio.Event()
        if worker_status == "draining" and not s.stopping.is_set():
            log.info(
                "an operator drained this worker: draining (stop claiming, finish %d active lease(s))",
                len(ledger.executions),
            )
            s.stopping.set()
        by_id = {ex.dispatch_id: ex for ex in active}
        for answer in answers:
            ex = by_id.get(answer.get("dispatch_id", ""))
            if ex is None:
                continue
            status = answer.get("status")
            if status == "renewed":
                ex.renew(int(answer.get("lease_remaining_ms") or 0), sent_at)
            elif status in ("revoked", "unknown"):
                ex.abort(f"heartbeat answered {status}")

    async def after(self, seen: int) -> None:
        """Wait (at most a few heartbeat intervals) for a heartbeat to succeed after the ``seen``-th one: after an
        outage a held result's lease is renewed (or revoked) by it before the result is sent again."""
        end = time.monotonic() + max(2.0, 4 * self.session.heartbeat_interval_s)
        while self.ok <= seen:
            remaining = end - time.monotonic()
            if remaining <= 0:
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._ok_event.wait(), remaining)

    def _failed(self, error: Exception) -> None:
        """Log the first failure of a streak and then every 20th (the loop keeps trying every interval)."""
        self._failures += 1
        if self._failures % 20 == 1:
            log.warning("heartbeat failed (%d in a row): %s", self._failures, error)
