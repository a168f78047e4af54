"""While its gateway cannot serve worker requests, the active coordinator holds no silence against workers."""

from __future__ import annotations

import asyncio

import psycopg

from awp.server.coordinator import Coordinator
from awp_testing.cluster import one


def _worker_after_passes(dsn: str, serving: bool) -> str:
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("SELECT awp.configure(heartbeat_interval_ms => 50, lease_duration_ms => 500)")
        worker_id = one(c, "SELECT worker_id FROM awp.register_worker('quiet', ARRAY['mock'], 1)")[0]
        c.execute(
            "UPDATE awp.workers SET last_heartbeat_at = now() - interval '1 hour' WHERE worker_id = %s", [worker_id]
        )

        async def passes() -> None:
            coordinator = Coordinator(dsn, interval_s=0.05, serving=lambda: serving)
            coordinator.start()
            try:
                async with asyncio.timeout(30):  # bounds a hang (a coordinator that stopped passing) only
                    while coordinator.passes < 8:  # spans several offline windows (3 x 50 ms)
                        await asyncio.sleep(0.05)
            finally:
                await coordinator.stop()

        asyncio.run(passes())
        return one(c, "SELECT status FROM awp.workers WHERE worker_id = %s", [worker_id])[0]


def test_silent_worker_goes_offline_while_the_gateway_serves(db_dsn):
    assert _worker_after_passes(db_dsn, serving=True) == "offline"


def test_silent_worker_is_spared_while_the_gateway_cannot_serve(db_dsn):
    assert _worker_after_passes(db_dsn, serving=False) == "active"


def test_a_failing_pass_callback_does_not_cost_the_lead(db_dsn):
    """A bug in the pass callback (metrics) is logged; the coordinator keeps its lock and keeps passing."""
    calls: list[int] = []

    def on_pass(counts: dict, seconds: float) -> None:
        calls.append(1)
        if len(calls) <= 2:
            raise ValueError("a broken metrics callback")

    async def passes() -> tuple[int, bool]:
        coordinator = Coordinator(db_dsn, interval_s=0.05, on_pass=on_pass)
        coordinator.start()
        try:
            async with asyncio.timeout(30):  # bounds a hang only
                while coordinator.passes < 6:
                    await asyncio.sleep(0.05)
            return coordinator.passes, coordinator.active
        finally:
            await coordinator.stop()

    n, active = asyncio.run(passes())
    assert n >= 6 and active, "passes went on after the callback raised, and the replica stayed active"
    assert len(calls) >= 6
