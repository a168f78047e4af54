"""The coordinator loop inside ``awp serve`` (docs/protocol.md, rule 12).

Every gateway replica runs one :class:`Coordinator`. On a dedicated connection it calls
``awp.take_leadership(holder)`` (db/functions/leadership.sql) every interval (at most 1 s, sooner when the
leader's lease is about to run out): the session that holds the advisory lock ``LOCK_KEY`` leads, with a
term that grows at every takeover; the others are standbys. A standby takes over at once when the leader's
session ends (PostgreSQL releases the lock), and after ``leader_lease_ms`` of silence on the database clock
when the leader is frozen (SIGSTOP, a paused VM) or behind a half-open connection: the database then ends
the leader's session. When the database role may not end it (a superuser's session), the standby does so
with its own rights (:meth:`Coordinator._terminate`).

The active coordinator runs ``awp.coordinator_tick(takeover, term, limits)`` (``takeover`` true on its first
pass, which restarts the workers' offline window; ``limits`` at most every ``LIMITS_EVERY_S``), then waits for
``NOTIFY awp_coordinator`` (new run, completion, cancel, worker change) or the interval, whichever comes first.
While a pass makes progress it runs the next one at once. Each pass renews the leadership; when the interval is long
compared with the lease it also sends ``awp.leader_heartbeat(term)`` every third of the lease. A pass,
heartbeat or retention batch whose term is over is refused (SQLSTATE ``AWLDR``, nothing written): the
coordinator steps down to standby and logs it once, as it does when its session was ended. A lost
connection is logged and retried with backoff; the process never dies of it.

While active, it also applies the retention setting in the background (docs/retention.md): every
``retention_interval_s`` one bounded prune batch, ``awp.apply_retention(term)``, on a connection of its own
(so passes never wait for it), and the next batches after a short pause while one says there is ``more``.
After them, on the same connection, ``awp.refresh_statistics()`` ANALYZEs the busy tables whose planner
statistics have fallen behind (db/functions/statistics.sql).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Callable
from typing import Any

import psycopg

from awp.server.pools import REACHABILITY, RECONNECT_MAX_S, connect, short_error

log = logging.getLogger("awp.coordinator")  # the log's name, not the module's (docs/operations.md, Logs)

LOCK_KEY = 0x4157_505F_434F_4F52  # "AWP_COOR" (= awp._coordinator_lock_key(), db/functions/leadership.sql)
LEADERSHIP_LOST = "AWLDR"  # SQLSTATE of a pass, heartbeat or retention batch whose term is over
CHANNEL = "awp_coordinator"
MAX_QUICK_PASSES = 100  # passes in a row without waiting, even if every one made progress
RETENTION_BURST = 20  # retention batches in a row while each says there is more, then the interval again
RETENTION_PAUSE_S = 0.2  # between the batches of a burst
NOTICE_REPEAT_S = 60.0  # a pass's WARNING (a run skipped) is logged again after this long
# How often a pass also says which limits hold ready tasks back ("limited", /metrics): it visits every live run.
LIMITS_EVERY_S = 2.0
DUE_MARGIN_S = 0.002  # a pass woken for a due retry or wait comes this long after it (the database counts whole ms)


class LeadershipLost(Exception):
    """The database refused a call of this coordinator (AWLDR): another one leads now."""


def default_holder() -> str:
    """How this process names itself in awp.coordinator_leader: host:pid."""
    return f"{socket.gethostname()}:{os.getpid()}"[:200]


class Coordinator:
    """Leader election (advisory lock, term, leader lease) plus the tick loop. ``active`` says whether
    this replica leads; ``term`` is its term while it does."""

    def __init__(
        self,
        dsn: str,
        interval_s: float = 1.0,
        on_pass: Callable[[dict[str, Any], float], None] | None = None,
        on_active: Callable[[bool], None] | None = None,
        serving: Callable[[], bool] | None = None,
        retention_interval_s: float | None = 5.0,
        on_retention: Callable[[dict[str, Any], float], None] | None = None,
        holder: str | None = None,
    ) -> None:
        self.dsn = dsn
        self.holder = holder or default_holder()
        self.term: int | None = None
        self.lease_s = 10.0  # leader_lease_ms as the database last said (take_leadership, leader_heartbeat)
        self.takeovers = 0
        self._renewed = 0.0  # time.monotonic() of the latest pass or heartbeat that renewed the leadership
        self._terminate_warned = False
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
        self._notices_logged: dict[str, float] = {}
        self._limits_at = float("-inf")  # the first pass asks for them
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
            log.info("coordinator %s", f"active (term {self.term}, holder {self.holder})" if active else "standby")
            if self.on_active is not None:
                self.on_active(active)
            if active and self.retention_interval_s is not None:
                self._retention = asyncio.get_running_loop().create_task(self._retention_loop(), name="awp-retention")
            elif not active and self._retention is not None:
                self._retention.cancel()  # it closes its connection; a batch in flight rolls back

    async def _retention_loop(self) -> None:
        """While active: ``awp.apply_retention(term)`` every interval, and again at once while it says ``more``."""
        assert self.retention_interval_s is not None
        term = self.term
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
                        cur = await conn.execute("SELECT awp.apply_retention(%s)", (term,))
                        row = await cur.fetchone()
                    except (psycopg.Error, OSError) as e:
                        if isinstance(e, psycopg.Error) and e.sqlstate == LEADERSHIP_LOST:
                            log.info("retention batch refused: term %s is over", term)  # the pass loop steps down
                            return
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
                if conn is not None and not conn.closed and not self._stopping.is_set():
                    try:
                        cur = await conn.execute("SELECT awp.refresh_statistics()")
                        row = await cur.fetchone()
                        if row and row[0]:
                            log.debug("statistics refreshed: %s", ", ".join(row[0]))
                    except psycopg.Error as e:
                        log.warning("statistics refresh failed (%s)", e)
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
                REACHABILITY.reached()
                self._conn.add_notice_handler(self._log_notice)
                backoff = 0.1
                await self._standby(self._conn)
                if not self._stopping.is_set():
                    await self._lead(self._conn)
            except LeadershipLost as e:
                log.warning("coordinator stepping down: %s", e)
            except (psycopg.OperationalError, psycopg.InterfaceError, OSError) as e:
                if self._stopping.is_set():
                    pass
                elif self.active:  # e.g. a standby ended this session after a whole lease of silence
                    log.warning(
                        "coordinator stepping down: its database session ended (%s); term %s", short_error(e), self.term
                    )
                else:  # REACHABILITY says it once for the outage, not once per attempt
                    REACHABILITY.failed(e)
                    log.debug(
                        "coordinator lost its database connection (%s); retrying in %.1fs", short_error(e), backoff
                    )
            except psycopg.Error:
                log.exception("coordinator database error; reconnecting in %.1fs", backoff)
            except Exception:  # a bug (e.g. in a pass callback) must not leave this replica silently standby
                log.exception("coordinator pass failed; reconnecting in %.1fs", backoff)
            finally:
                self._set_active(False)
                self.term = None
                conn, self._conn = self._conn, None
                if conn is not None:
                    with contextlib.suppress(Exception):
                        if not conn.closed:
                            await conn.execute("SELECT pg_advisory_unlock_all()")
                        await conn.close()
            if not self._stopping.is_set():
                await self._sleep(backoff)
                backoff = min(backoff * 2, RECONNECT_MAX_S)

    def _log_notice(self, diag: psycopg.errors.Diagnostic) -> None:
        """A WARNING of a pass (a run skipped after it failed: awp._pass_skip, db/functions/coordinator_tick.sql),
        logged; the same text at most once a minute, since a bad run fails again on every pass."""
        if diag.severity_nonlocalized != "WARNING":
            return
        text, now = str(diag.message_primary), time.monotonic()
        if now - self._notices_logged.get(text, -NOTICE_REPEAT_S) >= NOTICE_REPEAT_S:
            if len(self._notices_logged) > 1000:
                self._notices_logged.clear()
            self._notices_logged[text] = now
            log.warning("%s", text)

    async def _standby(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Return once this session leads (``self.term`` set), or we are stopping."""
        retry = min(self.interval_s, 1.0)
        ended: int | None = None  # the silent leader's session this standby ended itself (_terminate)
        while not self._stopping.is_set():
            cur = await conn.execute("SELECT awp.take_leadership(%s)", (self.holder,))
            row = await cur.fetchone()
            answer: dict[str, Any] = dict(row[0]) if row and row[0] else {}
            if answer.get("leader"):
                self.term = int(answer["term"])
                self.lease_s = int(answer["leader_lease_ms"]) / 1000
                self._renewed = time.monotonic()
                ended = answer.get("terminated_pid") or ended
                if ended is not None:
                    self.takeovers += 1
                    log.warning(
                        "coordinator taking over (term %s): the leader was silent for leader_lease_ms (%d ms); "
                        "its session %s was ended",
                        self.term,
                        int(answer["leader_lease_ms"]),
                        ended,
                    )
                return
            if answer.get("reason") == "cannot_terminate" and await self._terminate(conn, int(answer["pid"])):
                ended = int(answer["pid"])
                continue  # its session is gone: ask again at once
            wait = retry
            remaining = answer.get("lease_remaining_ms")
            if isinstance(remaining, int):  # wake up just after the leader's lease would run out
                wait = min(retry, remaining / 1000 + 0.01)
            await self._sleep(wait)

    async def _terminate(self, conn: psycopg.AsyncConnection[Any], pid: int) -> bool:
        """End the session ``pid`` of a leader silent for a whole lease (awp.take_leadership said so, but
        awp_owner may not end it: a superuser's, or no pg_signal_backend) with this login's own rights, if it
        still holds the coordinator's lock. True when it ended."""
        try:
            cur = await conn.execute(
                "SELECT pg_catalog.pg_terminate_backend(l.pid, 5000) FROM pg_catalog.pg_locks l"
                " WHERE l.pid = %s AND l.locktype = 'advisory' AND l.granted AND l.objsubid = 1"
                " AND l.classid = %s AND l.objid = %s AND l.database ="
                " (SELECT d.oid FROM pg_catalog.pg_database d WHERE d.datname = pg_catalog.current_database())",
                (pid, LOCK_KEY >> 32, LOCK_KEY & 0xFFFF_FFFF),
            )
            row = await cur.fetchone()
        except psycopg.errors.InsufficientPrivilege as e:
            if not self._terminate_warned:  # once: a standby asks every interval
                self._terminate_warned = True
                log.error(
                    "the coordinator leader (session %s) is silent but neither awp_owner nor this login may end its "
                    "session (%s): GRANT pg_signal_backend TO awp_owner (docs/operations.md)",
                    pid,
                    e,
                )
            return False
        if not (row and row[0]):
            return False
        log.warning(
            "ended the silent leader's session %s with this login's own rights (awp_owner may not: "
            "a superuser's session, or no pg_signal_backend)",
            pid,
        )
        return True

    def _refused(self, what: str, e: psycopg.Error) -> LeadershipLost:
        detail = e.diag.message_detail if e.diag is not None else None
        return LeadershipLost(f"{what} refused, term {self.term} is over ({detail or e})")

    async def _lead(self, conn: psycopg.AsyncConnection[Any]) -> None:
        await conn.execute(f"LISTEN {CHANNEL}")
        self._set_active(True)
        takeover = True
        quick = 0
        woke_for_due = False  # the last wait ended because a retry or wait fell due (not a NOTIFY, not the interval)
        while not self._stopping.is_set():
            started = time.perf_counter()
            try:
                if self.serving is not None and not self.serving():
                    takeover = True
                limits = time.monotonic() - self._limits_at >= LIMITS_EVERY_S
                cur = await conn.execute("SELECT awp.coordinator_tick(%s, %s, %s)", (takeover, self.term, limits))
                if limits:
                    self._limits_at = time.monotonic()
                row = await cur.fetchone()
            except (psycopg.OperationalError, psycopg.InterfaceError):
                raise
            except psycopg.Error as e:
                if e.sqlstate == LEADERSHIP_LOST:
                    raise self._refused("pass", e) from e
                # A bug or a transient conflict in one pass: keep the lead, try again after the interval.
                log.exception("coordinator pass failed")
                await self._wait_for_work(conn)
                continue
            self._renewed = time.monotonic()
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
            # A retry or a wait due before the interval ends gets its pass then (awp.next_due_ms), unless the pass
            # just woken for one found nothing to do (a due task it could not take now, e.g. its run busy): then
            # the interval, so that such a task never makes the coordinator spin.
            due_s = None if woke_for_due and not progress else await self._next_due_s(conn)
            woke_for_due = await self._wait_for_work(conn, due_s)

    async def _next_due_s(self, conn: psycopg.AsyncConnection[Any]) -> float | None:
        """Seconds until the earliest retry or wait falls due (None: none), a little after it (the pass must find it
        due on the database's clock, which counts whole milliseconds)."""
        cur = await conn.execute("SELECT awp.next_due_ms()")
        row = await cur.fetchone()
        if not row or row[0] is None:
            return None
        return int(row[0]) / 1000 + DUE_MARGIN_S

    async def _heartbeat(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Renew the leadership between passes (awp.leader_heartbeat); learn the current leader lease."""
        try:
            cur = await conn.execute("SELECT awp.leader_heartbeat(%s)", (self.term,))
            row = await cur.fetchone()
        except (psycopg.OperationalError, psycopg.InterfaceError):
            raise
        except psycopg.Error as e:
            if e.sqlstate == LEADERSHIP_LOST:
                raise self._refused("heartbeat", e) from e
            raise
        self._renewed = time.monotonic()
        if row and row[0]:
            self.lease_s = int(row[0]["leader_lease_ms"]) / 1000

    async def _drain_notifies(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Drop wake-ups already received: the next pass covers them."""
        async for _ in conn.notifies(timeout=0, stop_after=1000):
            pass

    async def _wait_for_work(self, conn: psycopg.AsyncConnection[Any], due_s: float | None = None) -> bool:
        """Wait for a NOTIFY, the interval (or ``due_s``, when a retry or wait falls due sooner), or stop; swallow a
        burst of notifications into one pass. Renew the leadership every third of the lease meanwhile (when the
        interval is that long). True when the wait ended at ``due_s``."""
        for_due = due_s is not None and due_s < self.interval_s
        deadline = time.monotonic() + (due_s if for_due and due_s is not None else self.interval_s)
        while not self._stopping.is_set():
            now = time.monotonic()
            remaining = deadline - now
            if remaining <= 0:
                return for_due
            renew_in = self._renewed + self.lease_s / 3 - now
            if renew_in <= 0:
                await self._heartbeat(conn)
                continue
            got = False
            async for _ in conn.notifies(timeout=min(remaining, renew_in, 0.25), stop_after=1):
                got = True
            if got:
                await self._drain_notifies(conn)
                return False
        return False


class ShardCoordinators:
    """One :class:`Coordinator` per shard behind a PL/Proxy router (docs/scale-out.md): each shard elects its own
    leader among the gateways (its own advisory lock and term) and runs its own passes and retention. ``active``:
    this gateway leads at least one shard."""

    def __init__(self, members: list[Coordinator]) -> None:
        self.members = members

    @property
    def active(self) -> bool:
        return any(m.active for m in self.members)

    def start(self) -> None:
        for m in self.members:
            m.start()

    async def stop(self, timeout: float = 5.0) -> None:
        await asyncio.gather(*(m.stop(timeout) for m in self.members))
