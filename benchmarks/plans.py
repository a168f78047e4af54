"""The sizes of a benchmark run (``run.py``): ``Plan``, ``FULL`` (``make bench``) and ``QUICK`` (``--quick``), and
the lease and heartbeat of a fresh database, which the scenarios that change them restore."""

from __future__ import annotations

from dataclasses import dataclass, replace

DEFAULT_LEASE_MS = 15000
DEFAULT_HEARTBEAT_MS = 5000


@dataclass(frozen=True)
class Plan:
    name: str
    repeats: int  # of every throughput and recovery figure
    single_tasks: int
    single_workers: tuple[int, ...]
    multi_runs: int
    multi_tasks: int
    multi_workers: tuple[int, ...]
    batch_tasks: int  # in quick mode: the most; sized to about 8 s at the 4-worker rate measured before
    batch_repeats: int
    batch_workers: int
    batch_concurrency: int
    latency_samples: int
    recovery: tuple[tuple[str, int, int], ...]  # (label, lease_ms, heartbeat_ms)
    ref_clients: tuple[int, ...]
    ref_seconds: float
    ref_rows: int
    peer_workers: int  # procrastinate: processes x concurrency, on single_tasks jobs (AWP's 4-worker shape)
    peer_concurrency: int
    side_repeats: int  # of the side-by-side figures (AWP and the peer, alternating): the ratio that matters most
    # I/O-bound (issue 18): io_tasks mock tasks of io_sleep_ms each on io_workers x io_concurrency slots, default
    # settings; the ideal is io_tasks x io_sleep_ms / slots
    io_tasks: int = 2000
    io_sleep_ms: int = 2000
    io_workers: int = 2
    io_concurrency: int = 100
    io_repeats: int = 1
    # Many runs (issue 46; many_runs.py), all on many_workers workers x concurrency 1: (runs, tasks per run) started
    # in one transaction, their rounds alternating with one run of many_base_tasks (the base of their targets)
    many_workers: int = 4
    many_shapes: tuple[tuple[int, int], ...] = ((1000, 10), (10000, 1))
    many_base_tasks: int = 1000
    many_repeats: int = 2  # rounds; 10,000 runs x 1 task take about a minute a round on this machine
    # a backlog of backlog_runs x backlog_tasks ready tasks of a kind no worker serves: idle claims
    # (backlog_samples) and one run of many_base_tasks (backlog_repeats) with and without it
    backlog_runs: int = 1000
    backlog_tasks: int = 100
    backlog_samples: int = 30
    backlog_repeats: int = 3
    pass_runs: int = 10000  # live runs that nothing can dispatch, during pass_samples coordinator passes
    pass_samples: int = 50
    start_clients: tuple[int, ...] = (8, 1)  # POST .../runs: concurrent clients, start_seconds each
    start_seconds: float = 5.0
    log_pairs: int = 3  # logging: pairs of repetitions (INFO, WARNING), alternating
    # Dynamic workflows (issue 39; dynamic.py): a for_each over dynamic_items against a static run of as many tasks,
    # batch_workers x batch_concurrency, dynamic_repeats rounds alternating
    dynamic_items: int = 5000
    dynamic_repeats: int = 3
    # Rate limits (issue 40; pacing.py): pacing_tasks behind max_in_flight 50; per_window 100/s over pacing_seconds
    pacing_tasks: int = 2000
    pacing_seconds: float = 20.0


FULL = Plan(
    name="full",
    repeats=3,
    single_tasks=1000,
    single_workers=(1, 4, 16),
    multi_runs=8,
    multi_tasks=125,
    multi_workers=(16, 4),
    batch_tasks=10000,
    batch_repeats=3,
    batch_workers=4,
    batch_concurrency=16,
    latency_samples=50,
    recovery=(("default", DEFAULT_LEASE_MS, DEFAULT_HEARTBEAT_MS), ("short", 2000, 500)),
    ref_clients=(1, 4, 8),
    ref_seconds=5,
    ref_rows=300_000,
    peer_workers=4,
    peer_concurrency=1,
    side_repeats=5,
)

QUICK = replace(
    FULL,
    name="quick",
    repeats=2,
    side_repeats=2,
    single_tasks=200,
    multi_tasks=25,
    batch_tasks=2000,
    batch_repeats=1,
    latency_samples=15,
    recovery=(("short", 2000, 500),),
    ref_seconds=2,
    ref_rows=60_000,
    io_tasks=1000,  # 5 rounds of the 200 slots: ideal 10 s
    many_shapes=((100, 10), (1000, 1)),
    many_repeats=2,
    backlog_runs=100,
    backlog_samples=15,
    backlog_repeats=2,
    pass_runs=2000,
    pass_samples=30,
    start_seconds=3.0,
    log_pairs=2,
    dynamic_items=1000,
    dynamic_repeats=2,
    pacing_tasks=1000,
    pacing_seconds=5.0,
)
