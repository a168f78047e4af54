"""Executors: what a worker does with a lease. Each one turns (input, context) into a result dict
``{"kind": "success" | "temporary_failure" | "permanent_failure", "output"?, "error_code"?, "error_message"?}``.

- ``mock``: deterministic, driven by the input only (no code, no commands): ``sleep_ms``, ``fail``
  (``temporary`` | ``permanent``), ``fail_attempts`` (fail while attempt <= N), ``output``, ``echo``
  (``true``: the output is ``{"task", "run_input", "upstream"[, "item", "item_index"][, "output"]}``, what the task
  received; item and item_index in an instance of a for_each task).
  ``logs`` (a count: that many log lines through ``ctx.log``, docs/progress.md; for the benchmark's A/B).
- ``python``: the action names a handler registered with ``@awp.handlers.handler`` in a module the worker
  imported (``--handlers``). Never an import path, a file or a shell command.

Executors are cancelled (``asyncio.CancelledError``) when the worker loses the lease or reaches its local
deadline. ``execute`` returns (or raises) only once the handler has returned: a sync handler runs in a thread,
which cannot be interrupted, so a cancelled ``execute`` waits for the thread (its result is then discarded) and
the worker keeps that slot taken until then (a hung handler; a second cancellation stops the wait, when the
process exits). Results are checked against the server's limits by :func:`awp.protocol.results.check_result`.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import importlib.util
import logging
import os
import sys
import traceback
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

from awp.handlers import Context, HandlerFunc, PermanentError, get_handler, is_async
from awp.protocol.results import check_result as check_result  # re-exported: the check lives in awp.protocol.results
from awp.protocol.results import failure, success
from awp.protocol.wire import Result

log = logging.getLogger("awp.executors")  # the log's name, not the module's (docs/operations.md, Logs)

HANDLER_THREAD_PREFIX = "awp-handler"
MOCK_MAX_LOGS = 10_000  # the mock executor's ``logs`` at most


class Executor(Protocol):
    kind: str

    async def execute(self, action: str, input: Any, ctx: Context) -> Result: ...


class MockExecutor:
    """Deterministic from the input: sleeps ``sleep_ms``, then fails or succeeds as the input says."""

    kind = "mock"

    async def execute(self, action: str, input: Any, ctx: Context) -> Result:
        spec = input if isinstance(input, dict) else {}
        logs = spec.get("logs")
        if isinstance(logs, int) and not isinstance(logs, bool) and logs > 0:
            for i in range(min(logs, MOCK_MAX_LOGS)):
                ctx.log(f"{ctx.task_key}: line {i + 1} of {logs}")
        sleep_ms = spec.get("sleep_ms", 0)
        if isinstance(sleep_ms, int | float) and sleep_ms > 0:
            await asyncio.sleep(sleep_ms / 1000.0)
        fail_attempts = spec.get("fail_attempts")
        if isinstance(fail_attempts, int) and ctx.attempt <= fail_attempts:
            return failure(
                "temporary_failure", "mock_flaky", f"attempt {ctx.attempt} fails (fail_attempts={fail_attempts})"
            )
        fail = spec.get("fail")
        if fail == "temporary":
            return failure("temporary_failure", "mock_temporary", "mock task failed (temporary)")
        if fail == "permanent":
            return failure("permanent_failure", "mock_permanent", "mock task failed (permanent)")
        if spec.get("echo") is True:
            # Data flow made visible: what this task received (for demos and tests).
            echoed: dict[str, Any] = {"task": ctx.task_key, "run_input": ctx.run_input, "upstream": ctx.upstream}
            if ctx.item_index is not None:  # an instance of a for_each task (docs/dynamic.md)
                echoed["item"] = ctx.item
                echoed["item_index"] = ctx.item_index
            if "output" in spec:
                echoed["output"] = spec["output"]
            return success(echoed)
        if "output" in spec:
            return success(spec["output"])
        return success({"task": ctx.task_key, "action": action, "attempt": ctx.attempt})


def load_handler_module(name: str) -> ModuleType:
    """Import a handler module by dotted name, or from a ``.py`` file path (e.g. ``examples/handlers.py``)."""
    if name.endswith(".py") or os.sep in name:
        path = Path(name).resolve()
        if not path.is_file():
            raise ImportError(f"handler file not found: {name}")
        mod_name = f"awp_handlers_{path.stem}"
        spec = importlib.util.spec_from_file_location(mod_name, path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load handler file {name}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[mod_name] = module
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(name)
    log.info("loaded handlers from %s", name)
    return module


class PythonExecutor:
    """Runs the handler registered for the action; sync handlers run in a thread."""

    kind = "python"

    def __init__(self, modules: Iterable[str] = (), threads: int = 32) -> None:
        for name in modules:
            load_handler_module(name)
        # Our own pool, not the loop's default one: asyncio.run() would wait at exit for a sync handler that
        # was cancelled (a thread cannot be interrupted); the worker exits without waiting for these.
        self._pool = ThreadPoolExecutor(max_workers=max(1, threads), thread_name_prefix=HANDLER_THREAD_PREFIX)

    async def execute(self, action: str, input: Any, ctx: Context) -> Result:
        func = get_handler(action)
        if func is None:
            return failure("permanent_failure", "unknown_action", f"no handler is registered for action {action!r}")
        try:
            if is_async(func):
                output = await func(input, ctx)
            else:
                output = await self._in_thread(func, input, ctx)
        except PermanentError as e:
            trace = traceback.format_exc()
            log.warning("handler %r failed for good on %s attempt %d:\n%s", action, ctx.task_key, ctx.attempt, trace)
            return failure("permanent_failure", e.error_code or "permanent_error", str(e) or repr(e), trace)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            trace = traceback.format_exc()  # stored with the attempt (error_detail), shown by awp run task
            log.warning("handler %r failed on %s attempt %d:\n%s", action, ctx.task_key, ctx.attempt, trace)
            return failure("temporary_failure", "handler_error", repr(e), trace)
        return success(output)

    async def _in_thread(self, func: HandlerFunc, input: Any, ctx: Context) -> Any:
        """Run a sync handler in the pool; when cancelled, wait until the handler has returned (a thread cannot
        be interrupted) and then raise CancelledError: a worker slot is free only once its handler has returned.
        A second cancellation (the process is exiting) stops the wait."""
        thread = asyncio.wrap_future(self._pool.submit(func, input, ctx))
        try:
            return await asyncio.shield(thread)
        except asyncio.CancelledError as cancelled:
            if not thread.done():
                with contextlib.suppress(Exception):
                    await asyncio.shield(thread)
            raise cancelled


KNOWN_KINDS = ("mock", "python")


def build_executors(
    kinds: Iterable[str], handler_modules: Iterable[str] = (), concurrency: int = 32
) -> dict[str, Executor]:
    """The executors named in ``kinds``; raises ValueError for an unknown kind."""
    out: dict[str, Executor] = {}
    modules = list(handler_modules)
    for kind in kinds:
        if kind == "mock":
            out[kind] = MockExecutor()
        elif kind == "python":
            if not modules:
                log.warning(
                    "python executor without --handlers: it runs no action, so it is given no python task"
                    " (routing by action: such tasks wait for a worker with a handler, reason no_worker_for_action)"
                )
            out[kind] = PythonExecutor(modules, threads=concurrency)
        else:
            raise ValueError(f"unknown executor {kind!r} (known: {', '.join(KNOWN_KINDS)})")
    if modules and "python" not in out:
        for name in modules:  # still import them, so a typo fails fast
            load_handler_module(name)
    return out
