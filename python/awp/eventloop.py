"""The event loop of every ``awp`` command: uvloop (libuv), through :func:`run` instead of ``asyncio.run``.

Measured on the benchmark's 1 run x 1,000 tasks with 4 workers (``make bench``): the gateway's CPU per request
0.39 -> 0.35 ms and the workers' CPU per task 0.46 -> 0.34 ms against asyncio's own loop (AWP issue 11).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

import uvloop

T = TypeVar("T")


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)`` on a uvloop event loop (same semantics: a new loop, closed at the end; Ctrl-C raises
    KeyboardInterrupt in the caller)."""
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main)
