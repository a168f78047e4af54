"""Live progress, logs and partial output of a running task, on the worker's side (docs/progress.md).

A handler calls ``ctx.progress(value)``, ``ctx.log(line)`` and ``ctx.emit(chunk)`` (:class:`awp.handlers.Context`);
each lease's reports gather in a :class:`LeaseOutput` (thread-safe: a sync handler runs in a thread), and one
:class:`ProgressSender` per worker sends them: every lease with something new at most once per ``interval_s``
(a few calls a second per lease, whatever the handler does), all due leases in one request
(``POST /workers/{id}/progress``); whatever is left goes with the lease's result (``finish``: the completion
request carries it as ``live_output``, written before the result), so a task's logs are complete once it shows as
done, without a round trip of their own. Each write carries its offset (the lines and chunks sent before it): one
sent again after a lost answer is applied once. A lease the gateway answers ``lease_lost`` for is fenced off: its
output is dropped and nothing more is sent for it.

Sizes are the database's limits (``awp._limit_progress_*()``, python/tests/integration/test_limits.py): a log line over
``MAX_ENTRY_BYTES`` is cut, a chunk over it is split, and a progress value over ``MAX_PROGRESS_BYTES`` raises
``ValueError`` in the handler (the gateway would refuse it with 413).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from awp.protocol.limits import MAX_BATCH_LEASES, MAX_ENTRIES, MAX_ENTRY_BYTES, MAX_PROGRESS_BYTES
from awp.protocol.wire import OutputWrite, ProgressItem
from awp.worker.client import Client, ClientError, GatewayError

log = logging.getLogger("awp.progress")  # the log's name, not the module's (docs/operations.md, Logs)

MAX_REQUEST_BYTES = 512 * 1024  # lines and chunks of one request (the gateway's body limit is 1 MiB)
MAX_PENDING_BYTES = 4 * 1024 * 1024  # unsent lines and chunks one lease keeps; past it the oldest are dropped
INTERVAL_S = 0.2  # a lease's writes are at least this far apart (at most 5 a second)
FINISH_TIMEOUT_S = 5.0  # how long a lease's result waits for its last output to be sent
FINAL_BYTES = 64 * 1024  # a lease's last writes ride on its completion request up to this size
CUT_MARK = " …[cut]"

_UNSET: Any = object()


def _cut_utf8(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` UTF-8 bytes (on a character boundary)."""
    data = text.encode()
    if len(data) <= limit:
        return text
    return data[:limit].decode(errors="ignore")


def _split_utf8(text: str, limit: int) -> list[str]:
    """``text`` in pieces of at most ``limit`` UTF-8 bytes, in order (never splitting a character)."""
    pieces: list[str] = []
    while len(text.encode()) > limit:
        head = _cut_utf8(text, limit)
        pieces.append(head)
        text = text[len(head) :]
    pieces.append(text)
    return pieces


class LeaseOutput:
    """One lease's reports not sent yet. ``progress``/``log``/``emit`` may be called from any thread."""

    def __init__(self, dispatch_id: str, lease_token: str, wake: Callable[[LeaseOutput], None]) -> None:
        self.dispatch_id = dispatch_id
        self.lease_token = lease_token
        self._wake = wake
        self._lock = threading.Lock()
        self._progress: Any = _UNSET
        self._entries: list[tuple[str, str, int]] = []  # (kind, text, UTF-8 bytes), in the order reported
        self._bytes = 0
        self.dropped = 0  # entries dropped by this worker (over MAX_PENDING_BYTES while the gateway lagged)
        self.fenced = False  # the gateway answered lease_lost: nothing more is sent
        self.taken = 0  # lines and chunks taken for sending so far (the offset of the next write)
        # The first write waits one interval too: what a short task reports goes with its result, no request of its own.
        self.last_sent = time.monotonic()
        self.finishing = False
        self.settled = asyncio.Event()  # set while no write of this lease is in flight
        self.settled.set()
        self.idle = asyncio.Event()  # set while nothing is pending or in flight
        self.idle.set()
        self.in_flight = False
        self.timer: asyncio.TimerHandle | None = None  # the sender's wake-up for this lease's next due write

    # -- the handler's side (any thread) --------------------------------------------------------------------

    def progress(self, value: Any) -> None:
        text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
        size = len(text.encode())
        if size > MAX_PROGRESS_BYTES:
            raise ValueError(f"progress is {size} bytes of JSON, over the {MAX_PROGRESS_BYTES}-byte limit")
        with self._lock:
            if self.fenced:
                return
            first = self._progress is _UNSET and not self._entries
            self._progress = json.loads(text)
        if first:  # the sender is woken once per batch, when this lease's next write is due
            self._wake(self)

    def log(self, line: Any) -> None:
        text = line if isinstance(line, str) else str(line)
        if len(text.encode()) > MAX_ENTRY_BYTES:
            text = _cut_utf8(text, MAX_ENTRY_BYTES - len(CUT_MARK.encode())) + CUT_MARK
        self._add([("log", text)])

    def emit(self, chunk: Any) -> None:
        text = chunk if isinstance(chunk, str) else json.dumps(chunk, separators=(",", ":"), ensure_ascii=False)
        self._add([("chunk", piece) for piece in _split_utf8(text, MAX_ENTRY_BYTES)])

    def _add(self, entries: list[tuple[str, str]]) -> None:
        with self._lock:
            if self.fenced:
                return
            first = self._progress is _UNSET and not self._entries
            for kind, text in entries:
                size = len(text.encode())
                self._entries.append((kind, text, size))
                self._bytes += size
            while self._bytes > MAX_PENDING_BYTES and len(self._entries) > 1:
                _, _, size = self._entries.pop(0)
                self._bytes -= size
                self.dropped += 1
        if first:
            self._wake(self)

    # -- the sender's side (the event loop) ----------------------------------------------------------------

    def pending_bytes(self) -> int:
        with self._lock:
            return self._bytes

    def pending(self) -> bool:
        with self._lock:
            return not self.fenced and (self._progress is not _UNSET or bool(self._entries))

    def take(self, budget: int) -> list[ProgressItem]:
        """The next writes of this lease, at most ``budget`` bytes of entries (at least one entry): one write per
        run of log lines followed by chunks (the database numbers a write's lines before its chunks), the progress
        value on the last; none when nothing is pending."""
        with self._lock:
            if self.fenced:
                return []
            progress = self._progress
            self._progress = _UNSET
            items: list[ProgressItem] = []
            logs: list[str] = []
            chunks: list[str] = []
            used = n = 0
            first = self.taken
            for kind, text, size in self._entries:
                if n and (used + size > budget or n >= MAX_ENTRIES):
                    break
                if kind == "log" and chunks:  # a line after chunks starts the next write: the order is kept
                    items.append(self._item(logs, chunks, first))
                    first += len(logs) + len(chunks)
                    logs, chunks = [], []
                (logs if kind == "log" else chunks).append(text)
                used += size
                n += 1
            del self._entries[:n]
            self._bytes -= used
            self.taken += n
        if logs or chunks or (progress is not _UNSET and not items):
            items.append(self._item(logs, chunks, first))
        if progress is not _UNSET:
            items[-1]["progress"] = progress
        return items

    def _item(self, logs: list[str], chunks: list[str], offset: int) -> ProgressItem:
        """One write; ``offset``: the lines and chunks taken before it (the database applies a repeat once)."""
        item: ProgressItem = {"dispatch_id": self.dispatch_id, "lease_token": self.lease_token, "offset": offset}
        if logs:
            item["logs"] = logs
        if chunks:
            item["chunks"] = chunks
        return item

    def restore(self, writes: list[ProgressItem]) -> None:
        """Put back writes that got no answer (they are sent again, before anything newer)."""
        with self._lock:
            if self.fenced:
                return
            back: list[tuple[str, str, int]] = []
            for item in writes:
                if "progress" in item and self._progress is _UNSET:
                    self._progress = item["progress"]
                back += [("log", t, len(t.encode())) for t in item.get("logs", [])]
                back += [("chunk", t, len(t.encode())) for t in item.get("chunks", [])]
            self._entries[:0] = back
            self._bytes += sum(size for _, _, size in back)
            self.taken -= len(back)

    def fence(self) -> None:
        with self._lock:
            self.fenced = True
            self._entries.clear()
            self._bytes = 0
            self._progress = _UNSET


def _without_lease(item: ProgressItem) -> OutputWrite:
    """A lease's write as its completion carries it (``live_output``: the lease is the completion's)."""
    write: OutputWrite = {}
    for key in ("progress", "logs", "chunks", "offset"):
        if key in item:
            write[key] = item[key]
    return write


class ProgressSender:
    """The worker's one sender of every lease's output (see the module docstring)."""

    def __init__(
        self,
        client: Client,
        worker_id: Callable[[], str],
        session_token: Callable[[], str],
        interval_s: float = INTERVAL_S,
    ) -> None:
        self.client = client
        self._worker_id = worker_id
        self._session_token = session_token
        self.interval_s = interval_s
        self._leases: dict[str, LeaseOutput] = {}
        self._wakeup = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self.requests = 0  # requests sent (for tests and the benchmark)

    def open(self, dispatch_id: str, lease_token: str) -> LeaseOutput:
        """The output of a lease that starts now (the sender starts with the first one)."""
        loop = asyncio.get_running_loop()
        if self._task is None or self._task.done():
            self._loop = loop
            self._task = loop.create_task(self._run(), name="progress-sender")
        out = LeaseOutput(dispatch_id, lease_token, self._wake_threadsafe)
        self._leases[dispatch_id] = out
        return out

    def _wake_threadsafe(self, out: LeaseOutput) -> None:
        """A lease has something new after nothing pending (from any thread): wake the sender when its next write
        is due (a timer: a task that ends before that sends it with its result, and the sender never runs)."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            self._wake_when_due(out)
        else:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(self._wake_when_due, out)

    def _wake_when_due(self, out: LeaseOutput) -> None:
        if out.timer is not None or self._leases.get(out.dispatch_id) is not out or self._loop is None:
            return  # already timed, or finished meanwhile
        delay = out.last_sent + self.interval_s - time.monotonic()
        if delay <= 0:
            self._wakeup.set()
        else:
            out.timer = self._loop.call_later(delay, self._due, out)

    def _due(self, out: LeaseOutput) -> None:
        out.timer = None
        self._wakeup.set()

    async def finish(self, out: LeaseOutput) -> list[OutputWrite]:
        """A lease's last writes, for its completion request to carry (``live_output``: no round trip of their own),
        once its write in flight (if any) is answered; what is over ``FINAL_BYTES`` is sent first, at once. Then the
        lease is forgotten."""
        try:
            if out.pending_bytes() > FINAL_BYTES:
                out.finishing = True
                out.idle.clear()
                self._wakeup.set()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(out.idle.wait(), FINISH_TIMEOUT_S)
            if out.in_flight:  # its write's answer first (without one in flight, no task and no turn of the loop)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(out.settled.wait(), FINISH_TIMEOUT_S)
            if out.in_flight:
                return []
            return [_without_lease(w) for w in out.take(FINAL_BYTES)]
        finally:
            self.discard(out)

    def discard(self, out: LeaseOutput) -> None:
        """Forget a lease's output unsent (its execution was aborted)."""
        if self._leases.get(out.dispatch_id) is out:
            del self._leases[out.dispatch_id]
        if out.timer is not None:
            out.timer.cancel()
            out.timer = None
        if out.dropped:
            log.warning(
                "lease %s: %d log lines or chunks dropped by the worker (too many unsent)", out.dispatch_id, out.dropped
            )

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task

    async def _run(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            while True:
                now = time.monotonic()
                due: list[LeaseOutput] = []
                next_at: float | None = None
                for out in list(self._leases.values()):
                    if not out.pending():
                        if out.finishing and not out.in_flight:
                            out.idle.set()
                        continue
                    at = out.last_sent + self.interval_s
                    if out.finishing or at <= now:
                        due.append(out)
                    else:
                        next_at = at if next_at is None else min(next_at, at)
                if due:
                    await self._send(due[:MAX_BATCH_LEASES])
                    continue
                if next_at is None:
                    break
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wakeup.wait(), max(0.0, next_at - time.monotonic()))
                self._wakeup.clear()

    async def _send(self, outs: list[LeaseOutput]) -> None:
        items: list[ProgressItem] = []
        taken: list[tuple[LeaseOutput, list[ProgressItem]]] = []
        budget = MAX_REQUEST_BYTES
        for out in outs:
            writes = out.take(max(1, budget // max(1, len(outs))))
            if not writes or len(items) + len(writes) > MAX_BATCH_LEASES:
                if writes:
                    out.restore(writes)
                continue
            items += writes
            taken.append((out, writes))
            out.in_flight = True
            out.settled.clear()
            out.last_sent = time.monotonic()
        if not items:
            return
        self.requests += 1
        answers: list[dict[str, Any]] = []
        try:
            answers = await self.client.report_progress_many(self._worker_id(), self._session_token(), items)
        except GatewayError as e:
            log.warning("progress of %d lease(s) not sent: %s", len(taken), e)
            for out, writes in taken:
                if e.retryable:
                    out.restore(writes)
                else:
                    out.fence()
            if e.retryable:
                await asyncio.sleep(min(1.0, e.retry_after_s or 0.5))
        except ClientError as e:
            log.warning("progress of %d lease(s) not sent: %s", len(taken), e)
            for out, writes in taken:
                out.restore(writes)
            await asyncio.sleep(0.5)
        finally:
            for out, _ in taken:
                out.in_flight = False
                out.settled.set()
        by_lease = {out.dispatch_id: out for out, _ in taken}
        for answer in answers:
            error = answer.get("error")
            refused = by_lease.get(str(answer.get("dispatch_id")))
            if error is not None and refused is not None and not refused.fenced:
                log.warning(
                    "lease %s: progress refused (%s: %s)", refused.dispatch_id, error.get("code"), error.get("message")
                )
                if error.get("code") == "lease_lost":
                    refused.fence()
        for out, _ in taken:
            if out.finishing and not out.pending():
                out.idle.set()
