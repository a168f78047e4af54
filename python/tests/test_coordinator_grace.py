"""While its gateway cannot serve worker requests, the active coordinator holds no silence against workers."""

from __future__ import annotations

import asyncio

import psycopg

from awp.coordinator import Coordinator


def _worker_after_passes(dsn: str, serving: bool) -> str:
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("SELECT awp.configure(heartbeat_interval_ms => 50, lease_duration_ms => 500)")
        worker_id = c.execute("SELECT worker_id FROM awp.register_worker('quiet', ARRAY['mock'], 1)").fetchone()[0]
        c.execute(
            "UPDATE awp.workers SET last_heartbeat_at = now() - interval '1 hour' WHERE worker_id = %s", [worker_id]
        )

        async def passes() -> None:
            coordinator = Coordinator(dsn, interval_s=0.05, serving=lambda: serving)
            coordinator.start()
            try:
                while coordinator.passes < 8:  # spans several offline windows (3 x 50 ms)
                    await asyncio.sleep(0.05)
            finally:
                await coordinator.stop()

        asyncio.run(passes())
        return c.execute("SELECT status FROM awp.workers WHERE worker_id = %s", [worker_id]).fetchone()[0]


def test_silent_worker_goes_offline_while_the_gateway_serves(db_dsn):
    assert _worker_after_passes(db_dsn, serving=True) == "offline"


def test_silent_worker_is_spared_while_the_gateway_cannot_serve(db_dsn):
    assert _worker_after_passes(db_dsn, serving=False) == "active"
