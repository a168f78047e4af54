"""A big live run's summary, read once for every tab for a moment (the run page's poll, python/awp/server/ui/pages.py).

The run page polls ``/ui/runs/{id}/changes`` about twice a second, and a live run changes all the time, so nearly
every poll reads the run again with ``awp.get_run``, which counts every task and what holds each waiting one:
1-5 ms for a run of a few hundred tasks, 45-80 ms for a live 10,000-task run on this project's machine in a slow
phase (130-140 ms before ``awp._task_waits`` ranked only the tasks a pass could take, when one tab on such a run
kept a PostgreSQL backend busy a quarter of the time, and each further tab as much again). So a read that cost at
least :data:`MIN_COST_S` is reused, by every tab of this gateway, for :data:`REUSE_FACTOR` times what it cost (at
most :data:`MAX_AGE_S`) while the run keeps its status: the database then spends at most about a tenth of its time
on one watched run's summary, whatever the number of tabs, and the summary lags by at most a second and a half (the
events still arrive with every poll: they are cheap to read). A small run's read is never reused, a finished run's
neither, and a change of status reads again at once. The answer carries the revision of the read it shows, so a
tab asks again until it has a read as new as the run.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from awp.protocol.statuses import LIVE_RUN

MIN_COST_S = 0.02  # reads cheaper than this are never reused
REUSE_FACTOR = 10.0  # a read is reused for this many times what it cost...
MAX_AGE_S = 1.5  # ...but never for longer than this
PRUNE_ABOVE = 100  # entries kept before the ones that may no longer be shown are dropped

Read = tuple[dict[str, Any], Any]  # awp.get_run's row, and what else the caller read with it


@dataclass
class _Entry:
    read: Read
    until: float  # monotonic time after which it is read again


class RecentRuns:
    """Per run, the last costly read of a live run and how long it may still be shown."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._entries: dict[str, _Entry] = {}

    async def read(self, run_id: str, status: str, fetch: Callable[[], Awaitable[Read]]) -> Read:
        """``fetch()`` for ``run_id`` (whose status is now ``status``), or its last result while that may be
        reused. ``fetch`` returns the run's ``awp.get_run`` row first."""
        now = self._clock()
        entry = self._entries.get(run_id)
        if entry is not None and now < entry.until and entry.read[0]["status"] == status:
            return entry.read
        read = await fetch()
        done = self._clock()
        cost = done - now
        if read[0]["status"] in LIVE_RUN and cost >= MIN_COST_S:
            self._entries[run_id] = _Entry(read, done + min(cost * REUSE_FACTOR, MAX_AGE_S))
        else:
            self._entries.pop(run_id, None)
        if len(self._entries) > PRUNE_ABOVE:
            self._entries = {k: e for k, e in self._entries.items() if e.until > done}
        return read
