"""Handlers used by the worker tests (loaded with ``--handlers python/tests/handlers_for_tests.py``)."""

from __future__ import annotations

import asyncio
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


@handler("test-hang")
def hang(input: Any, ctx: Context) -> str:
    time.sleep(3600)  # a sync handler that never returns (its thread cannot be interrupted)
    return "woke up"


@handler("test-sized-output")
def sized_output(input: Any, ctx: Context) -> list[int]:
    """A list whose jsonb text (``[1, 1, ..., 10]``) is exactly ``input["size"]`` bytes (at least 3); its compact
    JSON is a third smaller, so only a measure the database's way sees that it is over a limit."""
    size = int(input["size"])
    count, rest = divmod(size, 3)  # each "1, " is 3 bytes; the brackets replace the last ", "
    return [1] * (count - 1) + [10**rest]


@handler("test-item")
def item(input: Any, ctx: Context) -> dict[str, Any]:
    """An instance of a for_each task (docs/dynamic.md): what it was given."""
    doubled = ctx.item * 2 if isinstance(ctx.item, int) else None
    return {"item": ctx.item, "item_index": ctx.item_index, "doubled": doubled}


@handler("test-raise")
def raises(input: Any, ctx: Context) -> None:
    """Fails with a traceback (AWP issue 41: it is stored with the attempt)."""
    _deep_helper(int(input.get("n", 0)))


def _deep_helper(n: int) -> None:
    raise ValueError(f"boom {n}")


@handler("test-slow-first")
async def slow_first(input: Any, ctx: Context) -> dict[str, Any]:
    """Sleeps ``input["seconds"]`` (cancellable) on attempt 1 only; later attempts return at once (the drain test: a
    lease given back at shutdown runs to success elsewhere)."""
    if ctx.attempt == 1:
        await asyncio.sleep(float(input.get("seconds", 60)))
    return {"attempt": ctx.attempt}


@handler("test-stream")
async def stream(input: Any, ctx: Context) -> dict[str, Any]:
    """Live output (docs/progress.md): ``chunks`` chunks ``"<i>@<time.time()>;"`` ``interval_ms`` apart, a log line
    every ``log_every`` chunks and the progress {"done": i} after each; then the count."""
    import asyncio

    n, interval = int(input.get("chunks", 200)), float(input.get("interval_ms", 10)) / 1000
    log_every = int(input.get("log_every", 10))
    for i in range(n):
        ctx.emit(f"{i}@{time.time():.6f};")
        if i % log_every == 0:
            ctx.log(f"line {i}")
        ctx.progress({"done": i + 1, "of": n})
        await asyncio.sleep(interval)
    return {"chunks": n}


@handler("test-log-forever")
def log_forever(input: Any, ctx: Context) -> str:
    """A sync handler that logs a line every ``interval_ms`` for ``seconds`` (it cannot be interrupted)."""
    interval, end = float(input.get("interval_ms", 50)) / 1000, time.monotonic() + float(input.get("seconds", 10))
    i = 0
    while time.monotonic() < end:
        ctx.log(f"tick {i}")
        i += 1
        time.sleep(interval)
    return f"{i} lines"
