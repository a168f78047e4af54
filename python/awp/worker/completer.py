"""The completer: reports results (docs/protocol.md, Completions), one path for one result and for many, a single
completion being a batch of one.

A worker with several slots (``WorkerConfig.batching``) queues its results and :meth:`Completer.loop` sends the
ready ones together (``POST /workers/{id}/completions``): while one request is in flight the next results gather,
so a busy worker needs about one request per batch instead of one per task, and an idle one sends each result at
once. Otherwise each result goes at once on its lease's route (``POST .../leases/{dispatch_id}/complete``).

Either way a batch is retried with the same leases and results until the gateway answers for good (one rule for
an error answer: :func:`completion_verdict`); kept through an outage, never dropped for it. The first try asks for
one new lease per slot it frees (claim on complete: one round trip per task), unless the worker is stopping;
retries ask for none, so a lost answer strands no more leases than the batch frees. A result is checked against
the server's limits before it is sent (:mod:`awp.protocol.results`); one the server still refuses with a final 4xx
is reported once as a ``permanent_failure`` ``result_rejected`` with the server's message, never sent in a loop.
Each acknowledged result is appended to ``AWP_WORKER_ACK_LOG`` when set (:mod:`awp.worker.acklog`)."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from awp.protocol.limits import BODY_LIMIT, MAX_BATCH_RESULTS
from awp.protocol.results import refuses_result, rejected
from awp.protocol.wire import Completion, Lease, Result
from awp.worker.acklog import AckLog
from awp.worker.backoff import Backoff, is_outage, retry_after_of
from awp.worker.client import ClientError, GatewayError, TransportError
from awp.worker.config import SESSION_INVALID, SessionInvalid
from awp.worker.executions import Execution
from awp.worker.heartbeats import Heartbeats
from awp.worker.session import Session

log = logging.getLogger("awp.worker")

MAX_BATCH: Final = MAX_BATCH_RESULTS // 4  # results per completions request (64; the gateway takes up to 256)
# Bytes of results per completions request: well under the gateway's body limit (a single result, at most
# 64 KiB of jsonb text, is at most ~200 KiB of ASCII-escaped JSON, so one always fits).
MAX_BATCH_BYTES: Final = BODY_LIMIT // 2
# The status of a completions answer's error for one result (the gateway answers these per item: AWREQ is 400,
# AWLST and AWCNF are 409), for :func:`completion_verdict`.
ITEM_STATUS: Final = {"invalid_request": 400}


def completion_verdict(error: GatewayError) -> str:
    """What a completion does with a gateway's error answer, one rule for a single result and a batch alike:
    ``"session"`` (the session is gone: the worker stops), ``"replace"`` (the result itself was refused: a
    permanent failure ``result_rejected`` is sent once in its place), ``"retry"`` (the gateway or the database may
    answer later: 5xx, 429) or ``"drop"`` (the lease is lost, the result conflicts with the one applied, or any other
    refusal: the same request would get the same answer)."""
    if error.code == SESSION_INVALID:
        return "session"
    if error.code in ("lease_lost", "result_conflict"):
        return "drop"
    if refuses_result(error.status, error.code):
        return "replace"
    return "retry" if error.retryable else "drop"


@dataclass(eq=False)
class Pending:
    """A result waiting for its acknowledgement; ``leases`` gets the leases for the slot it frees."""

    execution: Execution
    result: Result
    leases: asyncio.Future[list[Lease]]
    replaced: bool = False  # refused once and replaced by result_rejected (never twice)

    def settle(self, leases: list[Lease]) -> None:
        if not self.leases.done():
            self.leases.set_result(leases)

    def body(self) -> Completion:
        """Its item of a completions request."""
        ex = self.execution
        item: Completion = {"dispatch_id": ex.dispatch_id, "lease_token": ex.lease_token, "result": self.result}
        if ex.live_output:  # its last progress writes (docs/progress.md)
            item["live_output"] = ex.live_output
        return item


def batch_size(queue: list[Pending]) -> int:
    """How many of the first results of ``queue`` go in one completions request: at most MAX_BATCH, and at most
    MAX_BATCH_BYTES of JSON as the client encodes it (always at least one)."""
    total = 0
    for n, item in enumerate(queue[:MAX_BATCH]):
        total += len(json.dumps(item.body(), separators=(",", ":"))) + 64
        if n and total > MAX_BATCH_BYTES:
            return n
    return min(len(queue), MAX_BATCH)


def _what(pending: list[Pending]) -> str:
    return f"lease {pending[0].execution.describe()}" if len(pending) == 1 else f"{len(pending)} result(s)"


class Completer:
    """Reports the results; leases that ride on an answer and have no slot waiting go to ``start``."""

    def __init__(self, session: Session, heartbeats: Heartbeats, start: Callable[[Lease, float], None]) -> None:
        self.session = session
        self.heartbeats = heartbeats
        self.start = start
        self.batching = session.config.batching
        self.queue: list[Pending] = []  # results waiting for the loop (batching)
        self.ready = asyncio.Event()
        self.acknowledged = 0
        self.rejected = 0  # results refused by the server and reported as result_rejected
        self.ack_log = AckLog()

    async def complete(self, ex: Execution, result: Result) -> list[Lease]:
        """Report ``ex``'s result; the leases for its slot. The slot stays taken until the result is acknowledged
        or dropped."""
        item = Pending(ex, result, asyncio.get_running_loop().create_future())
        if self.batching:
            self.queue.append(item)
            self.ready.set()
        else:
            await self.send([item])
        return await item.leases

    async def loop(self) -> None:
        """Send the queued results, as many per request as :func:`batch_size` allows."""
        try:
            while True:
                await self.ready.wait()
                self.ready.clear()
                while self.queue:
                    n = batch_size(self.queue)
                    batch, self.queue = self.queue[:n], self.queue[n:]
                    await self.send(batch)
        except SessionInvalid as e:
            self.session.set_fatal(e)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a bug: exit loudly rather than hold every slot forever
            log.exception("completer failed")
            self.session.set_fatal(e)
        finally:
            for item in self.queue:
                item.settle([])

    async def send(self, batch: list[Pending]) -> None:
        """Report a batch of results until the gateway answers for good (see the module docstring); each item's
        future gets its slot's leases."""
        s, ledger = self.session, self.session.ledger
        backoff = Backoff(100, 2000)
        claim_slots = 0 if s.stopping.is_set() or not s.config.claim_on_complete else len(batch)
        pending = list(batch)
        try:
            while pending:
                for item in [i for i in pending if i.execution.abort_reason is not None]:
                    ex = item.execution
                    log.warning("lease %s: %s while completing; dropping the result", ex.describe(), ex.abort_reason)
                    pending.remove(item)
                    item.settle([])
                if not pending:
                    return
                seq = ledger.claim_begin() if claim_slots else None
                try:
                    answers, leases = await self._post(pending, claim_slots, seq)
                except GatewayError as e:
                    ledger.claim_end(seq)
                    verdict = completion_verdict(e)
                    if verdict == "session":
                        raise SessionInvalid(e.message) from e
                    if verdict == "replace":
                        if len(pending) > 1:  # which result? each on its own (a refused one is then replaced)
                            log.warning(
                                "%d result(s): completions refused (%s); sending them one by one", len(pending), e
                            )
                            for item in pending:
                                await self.send([item])
                            return
                        if not pending[0].replaced:
                            self._replace(pending[0], e.status, e.code, e.message)
                            continue  # at once: the refused request changed nothing (and claimed nothing)
                        ex = pending[0].execution  # never a loop: the replacement itself was refused
                        log.error("lease %s: the server refused result_rejected too (%s); dropped", ex.describe(), e)
                        return
                    if verdict == "drop":
                        for item in pending:
                            ex = item.execution
                            log.warning(
                                "lease %s: complete answered %s (%s); dropped", ex.describe(), e.code, e.message
                            )
                        return
                    reason: ClientError = e
                except TransportError as e:
                    ledger.claim_end(seq)
                    reason = e
                else:
                    ledger.hold(leases)  # listed in heartbeats from now on, until their slots start them
                    ledger.claim_end(seq)
                    pending, claim_slots = self._answered(pending, answers, leases), 0
                    continue
                claim_slots = 0
                # The server's lease ends at most one margin after our local deadline: past that, a retry can only
                # answer lease_lost (or repeat an applied answer), so stop holding the slot. Not so while the gateway
                # or the database is unreachable (an outage): lease time does not run while no coordinator can work,
                # so the result is kept and sent again once they are back (docs/protocol.md, Lease recovery).
                outage = is_outage(reason)
                now = time.monotonic()
                for item in [i for i in pending if not outage and i.execution.expired(now)]:
                    log.warning(
                        "lease %s: complete failed (%s) and the lease has expired; dropped",
                        item.execution.describe(),
                        reason,
                    )
                    pending.remove(item)
                    item.settle([])
                if not pending:
                    return
                seen = self.heartbeats.ok
                delay = backoff.next_delay(retry_after_of(reason))
                log.warning("%s: complete failed (%s); retrying in %.2fs", _what(pending), reason, delay)
                await asyncio.sleep(delay)
                if outage:  # let a heartbeat renew the leases first (or revoke them: then they are dropped above)
                    await self.heartbeats.after(seen)
        finally:
            for item in batch:
                item.settle([])

    async def _post(
        self, pending: list[Pending], claim_slots: int, seq: int | None
    ) -> tuple[list[dict[str, Any]], list[Lease]]:
        """One request: (an answer per result, {dispatch_id, applied} or {dispatch_id, error}; the new leases)."""
        s = self.session
        if not self.batching and len(pending) == 1:  # the lease's own route: its error is the request's
            ex, result = pending[0].execution, pending[0].result
            applied, leases = await s.client.complete(
                s.worker_id,
                s.session_token,
                ex.dispatch_id,
                ex.lease_token,
                result,
                claim_slots=claim_slots if claim_slots else None,
                claim_seq=seq,
                live_output=ex.live_output,
            )
            return [{"dispatch_id": ex.dispatch_id, "applied": applied}], leases
        items = [item.body() for item in pending]
        return await s.client.complete_many(s.worker_id, s.session_token, items, claim_slots, claim_seq=seq)

    def _answered(self, pending: list[Pending], answers: list[dict[str, Any]], leases: list[Lease]) -> list[Pending]:
        """Settle each result by its answer, the leases going to the freed slots in turn; the results refused (and
        replaced by result_rejected) are returned, to be sent again."""
        by_id = {a.get("dispatch_id"): a for a in answers}
        refused = []
        for item in pending:
            ex = item.execution
            answer = by_id.get(ex.dispatch_id) or {}
            error = answer.get("error")
            if error is None:
                applied = answer.get("applied") is not False
                log.info("completed %s: %s%s", ex.describe(), item.result["kind"], "" if applied else " (not applied)")
                self._acknowledged(ex, item.result, applied)
            else:
                code, message = str(error.get("code")), str(error.get("message"))
                verdict = completion_verdict(GatewayError(ITEM_STATUS.get(code, 409), code, message))
                if verdict == "replace" and not item.replaced:
                    self._replace(item, ITEM_STATUS.get(code, 409), code, message)
                    refused.append(item)
                    continue
                log.warning("lease %s: complete answered %s (%s); dropped", ex.describe(), code, message)
            item.settle([leases.pop(0)] if leases else [])
        received_at = time.monotonic()
        for lease in leases:  # more leases than results cannot happen (claim_slots <= results); never strand one
            self.start(lease, received_at)
        return refused

    def _replace(self, item: Pending, status: int, code: str, message: str) -> None:
        """Send (once) a permanent failure result_rejected in place of a result the server refused for good."""
        self.rejected += 1
        log.warning(
            "lease %s: the server refused the result (%d %s: %s); reporting a permanent failure result_rejected",
            item.execution.describe(),
            status,
            code,
            message,
        )
        item.result, item.replaced = rejected(status, code, message), True

    def _acknowledged(self, ex: Execution, result: Result, applied: bool) -> None:
        ex.settled = True
        self.acknowledged += 1
        self.ack_log.record(ex, result, applied)
