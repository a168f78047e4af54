"""The gateway's shared LISTEN connection wakes one waiting claim per NOTIFY, and all of them on reconnect."""

from __future__ import annotations

import asyncio
import json

import psycopg

from awp.server.listener import DispatchListener
from awp_testing.cluster import one

EMPTY = (
    "TRUNCATE awp.events, awp.dispatches, awp.tasks, awp.runs, awp.signals, awp.task_output,"
    " awp.task_progress, awp.run_outputs, awp.ready_queue, awp.workers CASCADE"
)


async def _woken(listener: DispatchListener, n: int, timeout: float) -> list[bool]:
    return await asyncio.gather(*(listener.wait(timeout) for _ in range(n)))


def test_one_notification_wakes_one_waiter_and_reconnect_wakes_all():
    async def scenario() -> tuple[list[bool], list[bool]]:
        listener = DispatchListener("postgresql://unused")
        waits = asyncio.ensure_future(_woken(listener, 3, 0.5))
        await asyncio.sleep(0.05)
        listener.wake_one()
        one = await waits
        waits = asyncio.ensure_future(_woken(listener, 3, 2.0))
        await asyncio.sleep(0.05)
        listener.wake_all()
        return one, await waits

    one, everyone = asyncio.run(scenario())
    assert sorted(one) == [False, False, True]
    assert everyone == [True, True, True]


def test_each_dispatch_left_pending_sends_its_own_notification(db_dsn):
    """awp._notify_pending: one NOTIFY per pending dispatch of the transaction; none for one it leased."""
    with psycopg.connect(db_dsn, autocommit=True) as listen, psycopg.connect(db_dsn, autocommit=True) as c:
        c.execute(EMPTY)
        listen.execute("LISTEN awp_dispatch")
        c.execute("SELECT awp.register_worker('w', ARRAY['mock'], 5)")
        c.execute(
            "SELECT awp.create_workflow_version(%s)",
            [json.dumps({"id": "notify", "tasks": [{"key": f"t{i}", "executor": "mock"} for i in range(3)]})],
        )
        c.execute("SELECT awp.start_run('notify')")
        payloads = [n.payload for n in listen.notifies(timeout=1.0)]
    assert len(payloads) == 3 and len(set(payloads)) == 3
    assert all(p.startswith("mock dsp_") for p in payloads)


def test_a_dispatch_leased_in_its_own_transaction_wakes_nobody(db_dsn):
    with psycopg.connect(db_dsn, autocommit=True) as listen, psycopg.connect(db_dsn, autocommit=True) as c:
        c.execute(EMPTY)
        worker = one(c, "SELECT worker_id, session_token FROM awp.register_worker('solo', ARRAY['mock'], 1)")
        c.execute(
            "SELECT awp.create_workflow_version(%s)",
            [
                json.dumps(
                    {
                        "id": "chain",
                        "tasks": [
                            {"key": "a", "executor": "mock"},
                            {"key": "b", "executor": "mock", "depends_on": ["a"]},
                        ],
                    }
                )
            ],
        )
        c.execute("SELECT awp.start_run('chain')")
        c.execute("SELECT awp.coordinator_tick()")
        dispatch_id, lease_token = one(c, "SELECT dispatch_id, lease_token FROM awp.claim_tasks(%s, %s, 1)", worker)
        listen.execute("LISTEN awp_dispatch")
        leases = c.execute(
            'SELECT task_key FROM awp.complete_and_claim(%s, %s, %s, %s, \'{"kind": "success"}\', 1)',
            [*worker, dispatch_id, lease_token],
        ).fetchall()
        payloads = [n.payload for n in listen.notifies(timeout=0.5)]
    assert leases == [("b",)]
    assert payloads == []
