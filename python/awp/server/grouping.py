"""Grouping the gateway's claim-on-complete calls (docs/protocol.md, Refill and claim on complete).

Each ``awp.complete_and_claim`` call is a transaction of its own, with a fixed cost (the call, its checks, the
commit) besides its work; many such calls at once also compete for the database's cores and wait for each
other's locks. So the gateway keeps one grouped call in flight: while it is, further calls are held, and they go
together, as one ``awp.complete_and_claim_many`` call (one transaction, one commit, the group path settling
them set-based), when the call in flight returns. Alone, a call goes at once: grouping adds no latency, it only
forms under load. The calls of one group may be of several runs; the database settles each as its own call
would be settled, refills in fairness order included.

A grouped call must not wait for a stuck run (a run held by a DBA's session or a slow statement): every
other run's completions queue behind it. So it waits at most ``lock_wait_ms`` for any lock (its transaction's
``lock_timeout``); when that is not enough it changes nothing, and its items go to their runs' own queues
instead. A run's queue has at most one call in flight too (waiting as long as the request's ``lock_timeout``),
and while it has one, that run's next calls queue there as well, so a stuck run holds back only its own calls
and at most one connection (docs/operations.md, Timeouts and pools). Once a call of that queue got through (the
run was not stuck any more), what queued meanwhile goes back to the grouped calls and the queue ends.

Each grouped item is settled exactly as its own call would be; an item the database refuses (AWSES, AWREQ,
AWLST, AWCNF) gets the error its own call would have raised (:class:`ItemError`, mapped by
:mod:`awp.server.errors` like a database error). An error of the whole call (a timeout, a lost connection) is
every item's error: they all waited for the same call.

The gateway knows a dispatch's run from the leases it handed out (:meth:`RunGroups.remember`, bounded: the routes
that hand leases out tell it); a dispatch it does not know (leased through another gateway, or before a restart) is
completed on its own.

The calls go one way: the route (:mod:`awp.server.routes_workers`) calls :class:`RunGroups`, which calls the
database layer (:meth:`awp.server.db.Database.complete_and_claim` and ``complete_and_claim_many``, handed to it by
:mod:`awp.server.app`); the database layer knows nothing of the grouping.
"""

from __future__ import annotations

import asyncio
import collections
import zlib
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

Row = dict[str, Any]
MAX_GROUP = 64  # items of one awp.complete_and_claim_many call (its limit)
MAX_KNOWN = 100_000  # dispatch -> run entries kept (the oldest are forgotten first)
DEFAULT_LOCK_WAIT_MS = 100  # how long a grouped call may wait for a lock before its items go run by run
DEFAULT_LANES = 1  # grouped calls in flight at once (runs spread over them)
LOCK_NOT_AVAILABLE = "55P03"  # the SQLSTATE of a lock_timeout


class ItemError(Exception):
    """The database refused one grouped item: its SQLSTATE, message and detail, as its own call's error."""

    def __init__(self, sqlstate: str, message: str, detail: str | None) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate
        self.message = message
        self.detail = detail


@dataclass
class Item:
    """One ``complete_and_claim`` call waiting to be sent: its arguments, its run and the future of its leases."""

    args: dict[str, Any]
    run_id: str
    future: asyncio.Future[list[Row]] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class Single(Protocol):
    """``awp.complete_and_claim`` for one call's arguments; ``lock_wait_ms``: its transaction's lock_timeout."""

    def __call__(self, args: dict[str, Any], lock_wait_ms: int | None = None) -> Awaitable[list[Row]]: ...


class Many(Protocol):
    """``awp.complete_and_claim_many`` for several calls' arguments (rows: group_item, group_error, the lease
    columns)."""

    def __call__(self, items: list[dict[str, Any]], lock_wait_ms: int | None = None) -> Awaitable[list[Row]]: ...


class RunGroups:
    """One grouped call in flight per lane (every run at once, by default); a run whose grouped call could not take
    its locks in time gets a queue of its own (one call in flight, waiting as long as it must) until a call of that
    queue gets through or the queue is empty."""

    def __init__(
        self,
        single: Single,
        many: Many,
        on_group: Callable[[int], None] | None = None,
        lock_wait_ms: int = DEFAULT_LOCK_WAIT_MS,
        lanes: int = DEFAULT_LANES,
    ) -> None:
        self._single = single
        self._many = many
        self.on_group = on_group  # told the item count of every awp.complete_and_claim_many call (metrics)
        self.lock_wait_ms = lock_wait_ms
        self._runs: collections.OrderedDict[str, str] = collections.OrderedDict()  # dispatch_id -> run_id
        # Per lane: the calls held for its next grouped call; None: none in flight. A run's calls always take
        # the same lane (its run_id's CRC-32), so two lanes' calls never complete tasks of the same run.
        self._held: list[list[Item] | None] = [None] * lanes
        self._waiting: dict[str, list[Item]] = {}  # run_id -> its calls held; the key exists while one is in flight
        self._sending: set[asyncio.Task[None]] = set()  # the loop keeps only weak references to tasks

    def remember(self, leases: Iterable[Row]) -> None:
        """Note the run of every lease handed out (rows or objects with ``dispatch_id`` and ``run_id``)."""
        for lease in leases:
            self._runs[lease["dispatch_id"]] = lease["run_id"]
        while len(self._runs) > MAX_KNOWN:
            self._runs.popitem(last=False)

    async def complete_and_claim(self, args: dict[str, Any]) -> list[Row]:
        """One ``awp.complete_and_claim`` call (its arguments by name: worker_id, session_token, dispatch_id,
        lease_token, result, slots, claim_seq), alone or grouped."""
        run_id = self._runs.pop(args["dispatch_id"], None)
        if run_id is None:
            return await self._single(args)
        item = Item(args, run_id)
        lane = self._lane(run_id)
        held = self._held[lane]
        if run_id in self._waiting:  # its run has a queue of its own: join it
            self._waiting[run_id].append(item)
        elif held is not None:  # a grouped call of its lane is in flight: wait for the lane's next group
            held.append(item)
        else:
            self._held[lane] = []
            await self._send_group(lane, [item])
        return await item.future

    # -- the grouped calls (every run) ----------------------------------------------------------------------------

    def _lane(self, run_id: str) -> int:
        return zlib.crc32(run_id.encode()) % len(self._held)

    async def _send_group(self, lane: int, group: list[Item]) -> None:
        try:
            results = await self._call(group, self.lock_wait_ms)
        except BaseException as e:
            self._next_group(lane)
            if getattr(e, "sqlstate", None) == LOCK_NOT_AVAILABLE:  # nothing was written: run by run instead
                for item in group:
                    self._to_run_queue(item)
                return
            self._fail(group, e)  # the whole call failed: every item waited for it
            if not isinstance(e, Exception):
                raise
        else:
            try:
                if self._next_group(lane):  # the next group's query goes out before these answers are written
                    await asyncio.sleep(0)
            finally:  # answered even when this task is cancelled in that step
                self._answer(group, results)

    def _next_group(self, lane: int) -> bool:
        """The lane's grouped call in flight ended: send what was held meanwhile (True), or mark none in flight."""
        held = self._held[lane] or []
        if not held:
            self._held[lane] = None
            return False
        group, self._held[lane] = held[:MAX_GROUP], held[MAX_GROUP:]
        self._start(self._send_group(lane, group))
        return True

    # -- a run's own queue ------------------------------------------------------------------------------------------

    def _to_run_queue(self, item: Item) -> None:
        if item.future.done():  # its request was cancelled (the worker hung up)
            return
        held = self._waiting.get(item.run_id)
        if held is not None:
            held.append(item)
        else:
            self._waiting[item.run_id] = []
            self._start(self._send_run(item.run_id, [item]))

    async def _send_run(self, run_id: str, group: list[Item]) -> None:
        try:
            results = await self._call(group, None)
        except BaseException as e:  # the whole call failed: every item waited for the same run
            self._next_run(run_id)
            self._fail(group, e)
            if not isinstance(e, Exception):
                raise
        else:
            try:
                if self._rejoin(run_id):
                    await asyncio.sleep(0)
            finally:
                self._answer(group, results)

    def _rejoin(self, run_id: str) -> bool:
        """A call of ``run_id``'s queue got its locks: the queue ends, and what waited there joins the run's lane
        (sent at once when the lane has no call in flight: True)."""
        items = [item for item in self._waiting.pop(run_id, []) if not item.future.done()]
        if not items:
            return False
        lane = self._lane(run_id)
        held = self._held[lane]
        if held is not None:
            held.extend(items)
            return False
        self._held[lane] = items
        return self._next_group(lane)

    def _next_run(self, run_id: str) -> bool:
        """The call in flight for ``run_id``'s queue failed: send what waited there (True), or end the queue."""
        held = self._waiting.get(run_id)
        if not held:
            self._waiting.pop(run_id, None)
            return False
        group, self._waiting[run_id] = held[:MAX_GROUP], held[MAX_GROUP:]
        self._start(self._send_run(run_id, group))
        return True

    # -- both -------------------------------------------------------------------------------------------------------

    def _start(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _call(self, group: list[Item], lock_wait_ms: int | None) -> dict[int, list[Row] | ItemError]:
        """One database call for ``group``: each item's leases or error, by position (1-based)."""
        if len(group) == 1:
            return {1: await self._single(group[0].args, lock_wait_ms)}
        rows = await self._many([item.args for item in group], lock_wait_ms)
        if self.on_group is not None:
            self.on_group(len(group))
        return self._split(rows)

    def run_of(self, dispatch_id: str) -> str | None:
        """The run of a lease this gateway handed out (while it remembers it), else None."""
        return self._runs.get(dispatch_id)

    @staticmethod
    def _answer(group: list[Item], results: dict[int, list[Row] | ItemError]) -> None:
        for position, item in enumerate(group, start=1):
            if item.future.done():  # its request was cancelled (the worker hung up)
                continue
            answer = results.get(position, [])
            if isinstance(answer, ItemError):
                item.future.set_exception(answer)
            else:
                item.future.set_result(answer)

    @staticmethod
    def _fail(group: list[Item], e: BaseException) -> None:
        for item in group:
            if not item.future.done():
                item.future.set_exception(e)

    @staticmethod
    def _split(rows: list[Row]) -> dict[int, list[Row] | ItemError]:
        """Rows of ``awp.complete_and_claim_many`` (group_item, group_error, the lease columns) -> each item's
        answer."""
        out: dict[int, list[Row] | ItemError] = {}
        for row in rows:
            position, error = row.pop("group_item"), row.pop("group_error")  # the lease has an "item" column
            if error is not None:
                out[position] = ItemError(error["sqlstate"], error["message"], error.get("detail"))
                continue
            leases = out.setdefault(position, [])
            if row.get("dispatch_id") is not None and isinstance(leases, list):
                leases.append(row)
        return out
