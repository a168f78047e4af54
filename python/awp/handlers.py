"""The handler registry of the ``python`` executor.

A handler is a sync or async function ``(input, ctx)`` registered under an action name::

    from awp.handlers import PermanentError, handler

    @handler("send-invoice")
    async def send_invoice(input: dict, ctx: Context) -> dict:
        if "customer" not in input:
            raise PermanentError("no customer")          # permanent_failure: no retry
        # ctx.run_input: the run's input; ctx.upstream: {dependency key: its output}
        await billing.send(input["customer"], idempotency_key=ctx.idempotency_key)
        return {"sent": True}                             # the task's output (any JSON)

Any other exception is a ``temporary_failure`` (retried while attempts remain). Modules holding handlers
are imported by ``awp worker --handlers MODULE``; an action name that no module registered is a
``permanent_failure`` with ``error_code: unknown_action`` (an action is a name, never code to import).
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

HandlerFunc = Callable[[Any, "Context"], Any] | Callable[[Any, "Context"], Awaitable[Any]]

_REGISTRY: dict[str, HandlerFunc] = {}


class PermanentError(Exception):
    """Raised by a handler for a failure that retrying cannot fix: the task fails for good."""

    def __init__(self, message: str = "", error_code: str = "permanent_error") -> None:
        super().__init__(message)
        self.error_code = error_code


class OutputSink(Protocol):
    """Where a handler's progress, log lines and chunks go (the worker's :class:`awp.worker.progress.LeaseOutput`)."""

    def progress(self, value: Any) -> None: ...

    def log(self, line: Any) -> None: ...

    def emit(self, chunk: Any) -> None: ...


@dataclass(frozen=True)
class Context:
    """What a handler knows about the attempt it runs.

    ``deadline`` is a ``time.monotonic()`` value: the latest moment this attempt may run (its timeout, less the
    worker's safety margin). ``remaining()`` is the time left before the worker cancels it now: the lease must
    also keep being renewed, so it is at most ``deadline - time.monotonic()``, and grows with each renewal.
    Use ``idempotency_key`` (stable across attempts of a task) and ``fencing_token`` (grows with every lease)
    to make side effects safe to repeat.

    ``run_input`` is the input the run was started with (``{}`` when none). ``upstream`` maps the key of each
    task this one depends on to that task's output (``None`` when it returned none); ``{}`` for a root task.
    ``item`` and ``item_index``: in an instance of a ``for_each`` task, its element of the list and its index
    (docs/dynamic.md); ``None`` otherwise.

    Live output (docs/progress.md), callable from a sync or an async handler, never blocking: ``progress(value)``
    (any JSON value, at most 16 KiB; the latest wins), ``log(line)`` (a text line, appended) and ``emit(chunk)``
    (partial output in order, e.g. model tokens). The worker sends them in batches, a few times a second, and
    the rest before it reports the result. Outside a worker (no sink) they do nothing.
    """

    run_id: str
    task_key: str
    attempt: int
    fencing_token: int
    workflow_id: str
    action: str
    deadline: float
    _deadline_fn: Callable[[], float] | None = None
    run_input: dict[str, Any] = field(default_factory=dict)
    upstream: dict[str, Any] = field(default_factory=dict)
    item: Any = None
    item_index: int | None = None
    _output: OutputSink | None = None

    def progress(self, value: Any) -> None:
        """Report the task's progress: any JSON value (latest wins); ValueError over 16 KiB of JSON."""
        if self._output is not None:
            self._output.progress(value)

    def log(self, line: Any) -> None:
        """Append a log line (text; a line over 64 KiB is cut)."""
        if self._output is not None:
            self._output.log(line)

    def emit(self, chunk: Any) -> None:
        """Append a chunk of partial output (text, or any JSON value sent as its JSON text), in order."""
        if self._output is not None:
            self._output.emit(chunk)

    @property
    def idempotency_key(self) -> str:
        return f"{self.run_id}:{self.task_key}"

    def current_deadline(self) -> float:
        """The local safety deadline now (monotonic seconds): the renewed lease's end less the margin."""
        return self._deadline_fn() if self._deadline_fn else self.deadline

    def remaining(self) -> float:
        """Seconds left before the worker cancels this attempt (never negative)."""
        return max(0.0, self.current_deadline() - time.monotonic())


def handler(action: str) -> Callable[[HandlerFunc], HandlerFunc]:
    """Register the decorated function as the handler of ``action``; returns the function unchanged."""
    if not isinstance(action, str) or not action:
        raise ValueError("handler action name must be a non-empty string")

    def register(func: HandlerFunc) -> HandlerFunc:
        existing = _REGISTRY.get(action)
        if existing is not None and existing is not func:
            raise ValueError(f"action {action!r} already has a handler: {existing.__module__}.{existing.__qualname__}")
        _REGISTRY[action] = func
        return func

    return register


def get_handler(action: str) -> HandlerFunc | None:
    return _REGISTRY.get(action)


def registered_actions() -> list[str]:
    return sorted(_REGISTRY)


def is_async(func: HandlerFunc) -> bool:
    return inspect.iscoroutinefunction(func)


def unregister(action: str) -> None:
    """Remove a handler (for tests)."""
    _REGISTRY.pop(action, None)
