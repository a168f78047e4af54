"""Handlers used by the worker tests (loaded with ``--handlers python/tests/handlers_for_tests.py``)."""

from __future__ import annotations

import time
from typing import Any

from awp.handlers import Context, handler


@handler("test-context")
async def context(input: Any, ctx: Context) -> dict[str, Any]:
    return {
        "run_id": ctx.run_id,
        "task_key": ctx.task_key,
        "attempt": ctx.attempt,
        "fencing_token": ctx.fencing_token,
        "idempotency_key": ctx.idempotency_key,
        "remaining_ok": 0 < ctx.remaining() <= 60,
    }


@handler("test-big-output")
def big_output(input: Any, ctx: Context) -> str:
    return "x" * (70 * 1024)


@handler("test-flaky")
def flaky(input: Any, ctx: Context) -> str:
    if ctx.attempt < 2:
        raise ConnectionError("upstream hiccup")
    return "ok"


@handler("test-sync-sleep")
def sync_sleep(input: Any, ctx: Context) -> str:
    time.sleep(float(input.get("seconds", 60)))
    return "slept"
