"""The dispatch listener: one shared ``LISTEN awp_dispatch`` connection per gateway (:func:`awp.server.pools.connect`),
waking the long-polling claim requests (:class:`DispatchListener`)."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Sequence
from typing import Any

import psycopg

from awp.server.pools import REACHABILITY, RECONNECT_MAX_S, connect, short_error

log = logging.getLogger("awp.db")  # the log's name, not the module's (docs/operations.md, Logs)


class DispatchListener:
    """One shared ``LISTEN awp_dispatch`` connection per gateway, feeding an in-process wake-up.

    Long-polling claim requests wait on :meth:`wait` instead of querying. The database sends one
    NOTIFY per dispatch left pending (``awp._notify_pending``), and each wakes one waiter, oldest
    first, so a new dispatch costs one claim, not one per idle worker. (Re)connecting wakes every
    waiter, since notifications may have been missed meanwhile. The notification is only a hint:
    waiters re-check the database (``claim_tasks``) after each wake-up and after their own short
    re-check period, so a lost or misdirected hint costs latency, not correctness.
    """

    CHANNEL = "awp_dispatch"

    def __init__(self, dsn: str | Sequence[str], keepalive_s: float = 5.0) -> None:
        # Behind a PL/Proxy router (docs/scale-out.md) one LISTEN connection per shard: each shard's dispatches
        # notify on its own database, and every waiter may claim from any shard.
        self.dsns = [dsn] if isinstance(dsn, str) else list(dsn)
        self.keepalive_s = keepalive_s
        self._connected = [False] * len(self.dsns)
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._tasks: list[asyncio.Task[None]] = []
        self._closed = False

    @property
    def connected(self) -> bool:
        return all(self._connected)

    def wake_one(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def wake_all(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)

    async def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for a wake-up; True when woken."""
        if self._closed:
            return False
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await asyncio.wait_for(waiter, timeout)
        except TimeoutError:
            return False
        finally:
            if not waiter.done():
                waiter.cancel()
            with contextlib.suppress(ValueError):
                self._waiters.remove(waiter)
        return True

    @property
    def closed(self) -> bool:
        return self._closed

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._run(i), name=f"awp-dispatch-listener-{i}") for i in range(len(self.dsns))]

    async def close(self) -> None:
        self._closed = True
        self.wake_all()
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self, index: int) -> None:
        backoff = 0.1
        while not self._closed:
            conn: psycopg.AsyncConnection[Any] | None = None
            try:
                conn = await connect(self.dsns[index])
                REACHABILITY.reached()
                await conn.execute(f"LISTEN {self.CHANNEL}")
                self._connected[index] = True
                backoff = 0.1
                log.info("listening on %s", self.CHANNEL)
                self.wake_all()  # hints may have been missed while disconnected
                while not self._closed:
                    got = False
                    async for _ in conn.notifies(timeout=self.keepalive_s):
                        got = True
                        self.wake_one()
                    if not got:
                        await conn.execute("SELECT 1")  # notice a dead connection
            except (psycopg.Error, OSError) as e:
                if not self._closed:
                    REACHABILITY.failed(e)  # one line for the outage, not one per attempt
                    log.debug(
                        "dispatch listener lost its connection (%s); reconnecting in %.1fs", short_error(e), backoff
                    )
            finally:
                self._connected[index] = False
                if conn is not None:
                    with contextlib.suppress(Exception):
                        await conn.close()
            if not self._closed:
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, RECONNECT_MAX_S)
