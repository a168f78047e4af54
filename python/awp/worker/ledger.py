"""The lease ledger: every lease this worker holds and every claim request that may still hand it more
(docs/protocol.md, Lease recovery).

Every request that may claim is numbered (``claim_seq``); each heartbeat says which have ended (``claimed_through``,
``claims_pending``), so the server releases at once a lease whose answer never arrived. Leases received but not
started yet are held too (:attr:`Ledger.in_hand`), and leases given up without an acknowledged result are reported
as dropped (so they are not taken for lost answers) in the next :data:`DROPPED_REPORTS` successful heartbeats (the
server marks them, skipping a row another transaction holds at that instant: a later report marks it then)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from awp.protocol.wire import Lease, LeaseRef
from awp.worker.executions import Execution

# Successful heartbeats that report a dropped lease (docs/protocol.md, Lease recovery).
DROPPED_REPORTS = 3


@dataclass
class Dropped:
    """A lease given up without an acknowledged result, and how many successful heartbeats reported it so far."""

    ref: LeaseRef
    reports: int = 0


class Ledger:
    """The leases in hand (running, their result being sent, or received and not started yet), by dispatch id."""

    def __init__(self) -> None:
        self.executions: dict[str, Execution] = {}  # the leases whose execution started, until it ends
        self.in_hand: dict[str, Lease] = {}  # leases received whose execution has not started yet
        self.dropped: dict[str, Dropped] = {}
        self.claim_seq = 0
        self.claims_pending: set[int] = set()
        self.slot_freed = asyncio.Event()  # set when an execution ends (or a hung handler returns)

    # ---- claim numbering ---------------------------------------------------------------------------------

    def claim_begin(self) -> int:
        """Number a request that may claim (docs/protocol.md, Lease recovery); it is pending until claim_end."""
        self.claim_seq += 1
        self.claims_pending.add(self.claim_seq)
        return self.claim_seq

    def claim_end(self, seq: int | None) -> None:
        """The request ``seq`` got its answer (whose leases are started or in hand) or never will."""
        if seq is not None:
            self.claims_pending.discard(seq)

    # ---- leases ------------------------------------------------------------------------------------------

    def hold(self, leases: list[Lease]) -> None:
        """Leases received that their slots start a moment later: listed in heartbeats until then."""
        for lease in leases:
            self.in_hand[str(lease["dispatch_id"])] = lease

    def start(self, ex: Execution) -> None:
        """The execution of a lease (in hand until now, or just received) started."""
        self.in_hand.pop(ex.dispatch_id, None)
        self.executions[ex.dispatch_id] = ex

    def end(self, ex: Execution) -> None:
        """The execution ended; with no result acknowledged, the next heartbeats report its lease dropped."""
        self.executions.pop(ex.dispatch_id, None)
        if not ex.settled:
            self.dropped[ex.dispatch_id] = Dropped({"dispatch_id": ex.dispatch_id, "lease_token": ex.lease_token})

    def released(self, dispatch_id: str) -> None:
        """The lease was given back to the server (docs/protocol.md, Drain): nothing left to report."""
        self.dropped.pop(dispatch_id, None)

    # ---- heartbeats --------------------------------------------------------------------------------------

    def held(self) -> list[LeaseRef]:
        """Every lease held, running or in hand (composed in one go, with no await, by the heartbeat)."""
        refs: list[LeaseRef] = [
            {"dispatch_id": ex.dispatch_id, "lease_token": ex.lease_token} for ex in self.executions.values()
        ]
        refs += [{"dispatch_id": x["dispatch_id"], "lease_token": x["lease_token"]} for x in self.in_hand.values()]
        return refs

    def dropped_refs(self) -> list[LeaseRef]:
        return [d.ref for d in self.dropped.values()]

    def reported(self, refs: list[LeaseRef]) -> None:
        """A successful heartbeat reported these dropped leases (marked by the server, or at one of the next)."""
        for ref in refs:
            entry = self.dropped.get(ref["dispatch_id"])
            if entry is not None:
                entry.reports += 1
                if entry.reports >= DROPPED_REPORTS:
                    del self.dropped[ref["dispatch_id"]]

    # ---- cancelling --------------------------------------------------------------------------------------

    def abort_all(self, reason: str) -> None:
        for ex in list(self.executions.values()):
            ex.abort(reason)

    async def cancel_all(self, reason: str) -> None:
        """Abort every execution and wait (at most 5 s) for their tasks to end."""
        tasks = []
        for ex in list(self.executions.values()):
            ex.abort(reason)
            if ex.task is not None:
                tasks.append(ex.task)
        if tasks:
            await asyncio.wait(tasks, timeout=5.0)
