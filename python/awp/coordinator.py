"""The coordinator loop inside ``awp serve`` (docs/protocol.md, rule 12).

Every gateway replica runs one :class:`Coordinator`. On a dedicated connection it tries
``pg_try_advisory_lock(LOCK_KEY)``; the replica holding the lock is the active coordinator, the others
are standbys that retry every interval and take over as soon as the holder's session ends (the lock
is released by PostgreSQL when the process dies or its connection drops).

The active coordinator runs ``awp.coordinator_tick(takeover)`` (``takeover`` true on its first pass,
which restarts the workers' offline window), then waits for ``NOTIFY awp_coordinator`` (new run,
completion, cancel, worker change) or the interval, whichever comes first. While a pass makes
progress it runs the next one at once. A lost connection is logged and retried with backoff; the
process never dies of it.

While active, it also applies the retention setting in the background (docs/retention.md): every
``retention_interval_s`` one bounded prune batch, ``awp.apply_retention()``, on a connection of its own (so
passes never wait for it), and the next batches after a short pause while one says there is ``more``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

import psycopg

from awp.db import connect

log = logging.getLogger(__name__)

LOCK_KEY = 0x4157_505F_434F_4F52  # "AWP_COOR"
CHANNEL = "awp_coordinator"
MAX_QUICK_PASSES = 100  # passes in a row without waiting, even if every one made progress
RETENTION_BURST = 20  # retention batches in a row while each says there is more, then the interval again
RETENTION_PAUSE_S = 0.2  # between the batches of a burst


class Coordinator:
    """Leader election by advisory lock plus the tick loop. ``active`` says whether this replica leads."""

    def __init__(
        self,
        dsn: str,
        interval_s: float = 1.0,
        on_pass: Callable[[dict[str, Any], float], None] | None = None,
        on_active: Callable[[bool], None] | None = None,
        serving: Callable[[], bool] | None = None,
        retention_interval_s: float | None = 5.0,
        on_retention: Callable[[dict[str, Any], float], None] | None = None,
    ) -> None:
        self.dsn = dsn
        # None: no background retention (awp.prune by hand only).
        self.retention_interval_s = retention_interval_s
        self.on_retention = on_retention
        self.retention_batches = 0
        self._retention: asyncio.Task[None] | None = None
        # Whether this gateway can serve worker requests right now. While it cannot (its pool is
        # recovering from a database outage), each pass is a takeover: silence is not held against
        # workers whose heartbeats could not get through, and they get a full window once it can.
        self.serving = serving
        self.interval_s = interval_s
        self.on_pass = on_pass
        self.on_active = on_active
        self.active = False
        self.passes = 0
        self._stopping = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._conn: psycopg.AsyncConnection[Any] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="awp-coordinator")

    async def stop(self, timeout: float = 5.0) -> None:
        """Stop after the current pass, release the lock and close the connection."""
        self._stopping.set()
        if self._task is None:
            return
        try:
            await asyncio.wait_for(asyncio.shield(self._task), timeout)
        except TimeoutError:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        finally:
            if self._retention is not None:
                self._retention.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await self._retention
            if self._conn is not None:  # closing the session releases the advisory lock in any case
                with contextlib.suppress(Exception):
                    await self._conn.close()

    def _set_active(self, active: bool) -> None:
        if active != self.active:
            self.active = active
            log.info("coordinator %s", "active (advisory lock acquired)" if active else "standby")
            if self.on_active is not None:
                self.on_active(active)
            if active and self.retention_interval_s is not None:
                self._retention = asyncio.get_running_loop().create_task(self._retention_loop(), name="awp-retention")
            elif not active and self._retention is not None:
                self._retention.cancel()  # it closes its connection; a batch in flight rolls back

    async def _retention_loop(self) -> None:
        """While active: ``awp.apply_retention()`` every interval, and again at once while it says ``more``."""
        assert self.retention_interval_s is not None
        conn: psycopg.AsyncConnection[Any] | None = None
        try:
            while not self._stopping.is_set():
                await self._sleep(self.retention_interval_s)
                for _ in range(RETENTION_BURST):
                    if self._stopping.is_set():
                        return
                    try:
                        if conn is None or conn.closed:
                            conn = await connect(self.dsn)
                        started = time.perf_counter()
                        cur = await conn.execute("SELECT awp.apply_retention()")
                        row = await cur.fetchone()
                    except (psycopg.Error, OSError) as e:
                        log.warning("retention batch failed (%s); next try in %.1fs", e, self.retention_interval_s)
                        if conn is not None:
                            with contextlib.suppress(Exception):
                                await conn.close()
                        conn = None
                        break
                    counts: dict[str, Any] = dict(row[0]) if row and row[0] else {}
                    self.retention_batches += 1
                    if self.on_retention is not None:
                        self.on_retention(counts, time.perf_counter() - started)
                    pruned = {k: v for k, v in counts.items() if k not in ("more", "cutoff", "retention_ms") and v}
                    if pruned:
                        log.info("retention: pruned %s (before %s)", pruned, counts.get("cutoff"))
                    if not counts.get("more"):
                        break
                    await self._sleep(RETENTION_PAUSE_S)
        finally:
            if conn is not None:
                with contextlib.suppress(Exception):
                    await conn.close()

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), seconds)

    async def _run(self) -> None:
        backoff = 0.1
        while not self._stopping.is_set():
            try:
                self._conn = await connect(self.dsn)
                backoff = 0.1
                await self._standby(self._conn)
                if not self._stopping.is_set():
                    await self._lead(self._conn)
            except (psycopg.OperationalError, psycopg.InterfaceError, OSError) as e:
                if not self._stopping.is_set():
                    log.warning("coordinator lost its database connection (%s); retrying in %.1fs", e, backoff)
            except psycopg.Error:
                log.exception("coordinator database error; reconnecting in %.1fs", backoff)
            except Exception:  # a bug (e.g. in a pass callback) must not leave this replica silently standby
                log.exception("coordinator pass failed; reconnecting in %.1fs", backoff)
            finally:
                self._set_active(False)
                conn, self._conn = self._conn, None
                if conn is not None:
                    with contextlib.suppress(Exception):
                        if not conn.closed:
                            await conn.execute("SELECT pg_advisory_unlock_all()")
                        await conn.close()
            if not self._stopping.is_set():
                await self._sleep(backoff)
                backoff = min(backoff * 2, 2.0)

    async def _standby(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Return once this session holds the lock (or we are stopping)."""
        retry = min(self.interval_s, 1.0)
        while not self._stopping.is_set():
            cur = await conn.execute("SELECT pg_try_advisory_lock(%s)", (LOCK_KEY,))
            row = await cur.fetchone()
            if row is not None and row[0]:
                return
            await self._sleep(retry)

    async def _lead(self, conn: psycopg.AsyncConnection[Any]) -> None:
        await conn.execute(f"LISTEN {CHANNEL}")
        self._set_active(True)
        takeover = True
        quick = 0
        while not self._stopping.is_set():
            started = time.perf_counter()
            try:
                if self.serving is not None and not self.serving():
                    takeover = True
                cur = await conn.execute("SELECT awp.coordinator_tick(%s)", (takeover,))
                row = await cur.fetchone()
            except (psycopg.OperationalError, psycopg.InterfaceError):
                raise
            except psycopg.Error:
                # A bug or a transient conflict in one pass: keep the lock, try again after the interval.
                log.exception("coordinator pass failed")
                await self._wait_for_work(conn)
                continue
            takeover = False
            counts: dict[str, Any] = dict(row[0]) if row and row[0] else {}
            self.passes += 1
            if self.on_pass is not None:
                try:
                    self.on_pass(counts, time.perf_counter() - started)
                except Exception:  # metrics are not worth the lead: log the bug, keep coordinating
                    log.exception("coordinator pass callback failed")
            # Progress is any count above zero; "limited" (the limits still holding ready tasks) is not.
            progress = any(v for v in counts.values() if isinstance(v, int) and not isinstance(v, bool))
            if progress:
                log.debug("coordinator pass: %s", counts)
            if progress and quick < MAX_QUICK_PASSES:
                quick += 1
                await self._drain_notifies(conn)
                continue
            quick = 0
            await self._wait_for_work(conn)

    async def _drain_notifies(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Drop wake-ups already received: the next pass covers them."""
        async for _ in conn.notifies(timeout=0, stop_after=1000):
            pass

    async def _wait_for_work(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Wait for a NOTIFY, the interval, or stop; swallow a burst of notifications into one pass."""
        deadline = time.monotonic() + self.interval_s
        while not self._stopping.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            got = False
            async for _ in conn.notifies(timeout=min(remaining, 0.25), stop_after=1):
                got = True
            if got:
                await self._drain_notifies(conn)
                return
