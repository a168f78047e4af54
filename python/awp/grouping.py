"""Grouping one run's claim-on-complete calls (docs/protocol.md, Refill and claim on complete).

All transactions of one run serialise on that run's lock (its revision and event sequence). When several
workers complete tasks of one run at once, each ``awp.complete_and_claim`` call would wait in PostgreSQL for
the one before it, each in a transaction of its own. Instead, while one call for a run is in flight, the
gateway holds that run's further calls and sends them together, as one ``awp.complete_and_claim_many``
call (one transaction, one lock wait, one commit), when the call in flight returns. Alone, a call goes at
once: grouping adds no latency, it only forms under contention.

Each grouped item is settled exactly as its own call would be; an item the database refuses (AWSES, AWREQ,
AWLST, AWCNF) gets the error its own call would have raised (:class:`ItemError`, mapped by
:mod:`awp.errors` like a database error). An error of the whole call (a timeout, a lost connection) is
every item's error: they all waited for the same run.

The gateway knows a dispatch's run from the leases it handed out (:meth:`RunGroups.remember`, bounded); a
dispatch it does not know (leased through another gateway, or before a restart) is completed on its own.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

Row = dict[str, Any]
MAX_GROUP = 64  # items of one awp.complete_and_claim_many call (its limit)
MAX_KNOWN = 100_000  # dispatch -> run entries kept (the oldest are forgotten first)


class ItemError(Exception):
    """The database refused one grouped item: its SQLSTATE, message and detail, as its own call's error."""

    def __init__(self, sqlstate: str, message: str, detail: str | None) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate
        self.message = message
        self.detail = detail


@dataclass
class Item:
    """One ``complete_and_claim`` call waiting for its run: its arguments and the future of its leases."""

    args: dict[str, Any]
    future: asyncio.Future[list[Row]] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


Single = Callable[[dict[str, Any]], Awaitable[list[Row]]]
Many = Callable[[list[dict[str, Any]]], Awaitable[list[Row]]]


class RunGroups:
    """Per run: at most one call in flight; the calls that arrive meanwhile go together in the next one."""

    def __init__(self, single: Single, many: Many, on_group: Callable[[int], None] | None = None) -> None:
        self._single = single
        self._many = many
        self.on_group = on_group  # told the item count of every awp.complete_and_claim_many call (metrics)
        self._runs: collections.OrderedDict[str, str] = collections.OrderedDict()  # dispatch_id -> run_id
        self._waiting: dict[str, list[Item]] = {}  # run_id -> calls held; the key exists while one is in flight
        self._sending: set[asyncio.Task[None]] = set()  # the loop keeps only weak references to tasks

    def remember(self, leases: Iterable[Row]) -> None:
        """Note the run of every lease handed out (rows or objects with ``dispatch_id`` and ``run_id``)."""
        for lease in leases:
            self._runs[lease["dispatch_id"]] = lease["run_id"]
        while len(self._runs) > MAX_KNOWN:
            self._runs.popitem(last=False)

    async def complete_and_claim(self, args: dict[str, Any]) -> list[Row]:
        """One ``awp.complete_and_claim`` call (its arguments by name: worker_id, session_token, dispatch_id,
        lease_token, result, slots, claim_seq), alone or grouped with its run's."""
        dispatch_id = args["dispatch_id"]
        run_id = self._runs.pop(dispatch_id, None)
        if run_id is None:
            return await self._single(args)
        held = self._waiting.get(run_id)
        if held is not None:  # a call of this run is in flight: wait for the next group
            item = Item(args)
            held.append(item)
            return await item.future
        self._waiting[run_id] = []
        try:
            rows = await self._single(args)
        except BaseException:
            self._next(run_id)
            raise
        await self._hand_on(run_id)
        return rows

    async def _hand_on(self, run_id: str) -> None:
        """The call in flight for ``run_id`` returned: the next group goes to the database before this call's
        answers are written. All of a run's calls queue behind each other, so the gateway's work on one group's
        answers (the handlers' responses) is taken out of that queue: one event-loop step is yielded, in which the
        new group's task sends its query (an idle pool connection and an idle lock are taken without waiting)."""
        if self._next(run_id):
            await asyncio.sleep(0)

    def _next(self, run_id: str) -> bool:
        """The call in flight for ``run_id`` ended: send what waited meanwhile (True), or mark the run idle."""
        held = self._waiting.get(run_id)
        if not held:
            self._waiting.pop(run_id, None)
            return False
        group, self._waiting[run_id] = held[:MAX_GROUP], held[MAX_GROUP:]
        task = asyncio.get_running_loop().create_task(self._send(run_id, group))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)
        return True

    async def _send(self, run_id: str, group: list[Item]) -> None:
        try:
            if len(group) == 1:
                results: dict[int, list[Row] | ItemError] = {1: await self._single(group[0].args)}
            else:
                results = self._split(await self._many([item.args for item in group]))
                if self.on_group is not None:
                    self.on_group(len(group))
        except BaseException as e:  # the whole call failed: every item waited for the same run
            self._next(run_id)
            for item in group:
                if not item.future.done():
                    item.future.set_exception(e)
            if not isinstance(e, Exception):
                raise
        else:
            try:
                await self._hand_on(run_id)
            finally:  # answered even when this task is cancelled in that step
                for position, item in enumerate(group, start=1):
                    if item.future.done():  # its request was cancelled (the worker hung up)
                        continue
                    answer = results.get(position, [])
                    if isinstance(answer, ItemError):
                        item.future.set_exception(answer)
                    else:
                        item.future.set_result(answer)

    @staticmethod
    def _split(rows: list[Row]) -> dict[int, list[Row] | ItemError]:
        """Rows of ``awp.complete_and_claim_many`` (item, error, the lease columns) -> each item's answer."""
        out: dict[int, list[Row] | ItemError] = {}
        for row in rows:
            position, error = row.pop("item"), row.pop("error")
            if error is not None:
                out[position] = ItemError(error["sqlstate"], error["message"], error.get("detail"))
                continue
            leases = out.setdefault(position, [])
            if row.get("dispatch_id") is not None and isinstance(leases, list):
                leases.append(row)
        return out
