"""Explicit synchronisation for tests that race several database sessions.

A race test must prove that the interleaving it claims actually happened, not hope so after a ``sleep``:

- :func:`connect` opens one more session (autocommit, dict rows);
- :func:`in_thread` runs a call in a thread and keeps its result or exception (:class:`Call`);
- :func:`wait_blocked` waits until a session is blocked by another one's lock (``pg_blocking_pids``), and
  fails at once if the call it runs finished without ever waiting;
- :func:`wait_db_time_past` waits until the database clock has passed an instant (a lease expiry, ...).

Their timeouts only bound a hang: a test that passes never waits for them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row


def connect(dsn: str) -> psycopg.Connection[dict[str, Any]]:
    """A session of its own (autocommit, dict rows), one of the several a race test runs."""
    return psycopg.connect(dsn, autocommit=True, row_factory=dict_row)


class Call:
    """A call running in a thread: ``result()`` joins it and returns its value or raises its exception."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self._fn = fn
        self.value: Any = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.value = self._fn()
        except BaseException as e:  # re-raised by result()
            self.error = e

    def done(self) -> bool:
        return not self.thread.is_alive()

    def result(self, timeout: float = 30.0) -> Any:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"the call did not return within {timeout} s"
        if self.error is not None:
            raise self.error
        return self.value


def first_column(row: Any) -> Any:
    """The first column of a fetched row, a tuple or (``dict_row``) a dict; a test failure when there is none."""
    assert row is not None, "expected a row, got none"
    return row[0] if isinstance(row, tuple) else next(iter(row.values()))


def in_thread(fn: Callable[[], Any]) -> Call:
    return Call(fn)


def wait_blocked(
    observer: psycopg.Connection[Any], pid: int, call: Call | None = None, timeout: float = 10.0
) -> list[int]:
    """Wait until backend ``pid`` is blocked by a lock another session holds; return the blocking pids.

    ``call`` is what that backend runs: when it returns before it was ever seen blocked, the interleaving the
    test needs did not happen, and this fails at once (not after ``timeout``, which only bounds a hang).
    """
    deadline = time.monotonic() + timeout
    while True:
        blockers = list(first_column(observer.execute("SELECT pg_blocking_pids(%s)", [pid]).fetchone()))
        if blockers:
            return blockers
        if call is not None and call.done():
            error = f": {call.error!r}" if call.error else f" (answered {call.value!r})"
            raise AssertionError(f"backend {pid} finished without waiting for a lock{error}")
        assert time.monotonic() < deadline, f"backend {pid} was not blocked within {timeout} s"
        time.sleep(0.005)


def wait_db_time_past(observer: psycopg.Connection[Any], instant: datetime, timeout: float = 10.0) -> None:
    """Wait until the database's clock (``clock_timestamp()``, the one ``awp._now()`` reads) is past ``instant``."""
    deadline = time.monotonic() + timeout
    while True:
        if first_column(observer.execute("SELECT clock_timestamp() > %s", [instant]).fetchone()):
            return
        assert time.monotonic() < deadline, f"the database clock did not pass {instant} within {timeout} s"
        time.sleep(0.01)


def gateway_lock_waiters(observer: psycopg.Connection[Any]) -> int:
    """How many ``awp serve`` connections (application_name awp-gateway) wait for a lock right now."""
    row = observer.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'awp-gateway'"
        " AND wait_event_type = 'Lock' AND state = 'active'"
    ).fetchone()
    return int(row[0]) if row else 0
