"""The event loop of every ``awp`` command: uvloop (libuv), through :func:`run` instead of ``asyncio.run``
(what it saves: docs/performance.md, History of the throughput work)."""

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
