"""The run page's reuse of a big live run's read (python/awp/server/ui/recent.py), on a clock the test moves: a read
that
cost enough is shown again for ten times its cost (at most MAX_AGE_S) while the run keeps its status; a cheap read,
a finished run's and a changed status are read again."""

from __future__ import annotations

from typing import Any

from awp.server.ui.recent import MAX_AGE_S, MIN_COST_S, PRUNE_ABOVE, REUSE_FACTOR, RecentRuns


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Reads:
    """The reads a caller would make: each takes ``cost`` seconds of the clock and returns a new row."""

    def __init__(self, clock: Clock, status: str = "running", cost: float = 0.1) -> None:
        self.clock, self.status, self.cost, self.count = clock, status, cost, 0

    async def __call__(self) -> tuple[dict[str, Any], Any]:
        self.count += 1
        self.clock.now += self.cost
        return {"status": self.status, "revision": self.count}, None


async def test_a_costly_read_of_a_live_run_is_shown_again_for_ten_times_its_cost() -> None:
    clock = Clock()
    recent, reads = RecentRuns(clock), Reads(clock, cost=0.1)
    first = await recent.read("r", "running", reads)
    clock.now += 0.1 * REUSE_FACTOR - 0.01
    assert await recent.read("r", "running", reads) is first
    assert reads.count == 1
    clock.now += 0.02
    again = await recent.read("r", "running", reads)
    assert reads.count == 2 and again[0]["revision"] == 2


async def test_no_read_is_shown_for_longer_than_the_cap() -> None:
    clock = Clock()
    recent, reads = RecentRuns(clock), Reads(clock, cost=1.0)  # ten times that would be 10 s
    await recent.read("r", "running", reads)
    clock.now += MAX_AGE_S - 0.01
    await recent.read("r", "running", reads)
    assert reads.count == 1
    clock.now += 0.02
    await recent.read("r", "running", reads)
    assert reads.count == 2


async def test_a_cheap_read_a_finished_run_and_a_new_status_are_read_again() -> None:
    clock = Clock()
    cheap = Reads(clock, cost=MIN_COST_S / 2)
    recent = RecentRuns(clock)
    await recent.read("small", "running", cheap)
    await recent.read("small", "running", cheap)
    assert cheap.count == 2

    done = Reads(clock, status="succeeded", cost=0.5)
    await recent.read("done", "succeeded", done)
    await recent.read("done", "succeeded", done)
    assert done.count == 2

    live = Reads(clock, cost=0.5)
    await recent.read("big", "running", live)
    live.status = "canceled"
    canceled = await recent.read("big", "canceled", live)  # the status the poll read now differs: read again
    assert live.count == 2 and canceled[0]["status"] == "canceled"


async def test_runs_are_kept_apart_and_what_expired_is_forgotten() -> None:
    clock = Clock()
    recent = RecentRuns(clock)
    per_run = {f"r{i}": Reads(clock, cost=0.1) for i in range(150)}  # 15 s of reads, each kept for 1 s
    for run_id, reads in per_run.items():
        await recent.read(run_id, "running", reads)
    assert len(recent._entries) <= PRUNE_ABOVE + 1  # past that many entries, the expired ones were dropped
    last = await recent.read("r149", "running", per_run["r149"])  # the newest is still shown, its own
    assert per_run["r149"].count == 1 and last[0]["revision"] == 1
    await recent.read("r0", "running", per_run["r0"])  # the oldest has expired: read again
    assert per_run["r0"].count == 2
