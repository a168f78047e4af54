"""The worker runtime (docs/protocol.md, The worker): one asyncio process with a claim loop, a heartbeat loop and one
asyncio task per active lease.

Ownership is the server's: the worker only knows *durations* (``lease_remaining_ms``) and measures them with
its own monotonic clock from the moment it sent the request, never comparing wall clocks. Each lease gets a
local safety deadline = lease end - safety margin (capped at half the lease), pushed forward by each
``renewed`` heartbeat but never past the attempt deadline. When the deadline passes, or a heartbeat answers
``revoked``/``unknown``, the execution is cancelled and never completed: someone else may own it now.

Exit codes: 0 after a drain (SIGTERM/SIGINT), 2 for a rejected bootstrap token or bad configuration,
3 when the session became invalid (``worker_session_invalid``), 4 when a drain ended with handlers still running
that could not be stopped (hung sync handlers: a supervisor should restart the worker), 130 on a second signal.

A slot is free only once its handler has returned: a handler that does not return when its execution is
cancelled (a sync handler's thread cannot be interrupted) keeps its slot, and a worker whose every slot holds a
hung handler claims nothing and says so once (docs/operations.md, Hung handlers). A result is checked against
the server's limits before it is sent (:mod:`awp.protocol.results`); one the server still refuses with a final 4xx is
reported once as a ``permanent_failure`` ``result_rejected`` with the server's message, never sent in a loop.

``AWP_WORKER_ACK_LOG=PATH`` makes the worker append one JSON line per completion the gateway acknowledged
(``{"dispatch_id", "run_id", "task_key", "attempt", "fencing_token", "kind", "applied"}``), written after the
answer arrived: tests use it to prove that no acknowledged result is lost (e.g. across a database failover).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import signal
import socket
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from awp import eventloop
from awp.handlers import Context, registered_actions
from awp.protocol.limits import BODY_LIMIT
from awp.protocol.results import check_result, failure, refuses_result, rejected
from awp.worker.client import Client, ClientError, GatewayError, TlsVerifyError, TransportError, client_ssl_context
from awp.worker.executors import HANDLER_THREAD_PREFIX, Executor, build_executors
from awp.worker.progress import ProgressSender

log = logging.getLogger("awp.worker.runtime")

EXIT_OK = 0
EXIT_CONFIG = 2
EXIT_SESSION = 3
EXIT_HUNG = 4
EXIT_SIGNAL = 130

SESSION_INVALID = "worker_session_invalid"
MAX_BATCH = 64  # results per completions request (the gateway takes up to 256)
# Bytes of results per completions request: well under the gateway's body limit (a single result, at most
# 64 KiB of jsonb text, is at most ~200 KiB of ASCII-escaped JSON, so one always fits).
MAX_BATCH_BYTES = BODY_LIMIT // 2
# Successful heartbeats that report a dropped lease (docs/protocol.md, Lease recovery).
DROPPED_REPORTS = 3
# How long a cancelled handler may take to return before its slot counts as held by a hung handler.
HUNG_GRACE_S = 1.0


class SessionInvalid(Exception):
    """The gateway no longer accepts this worker session: the process must exit and register anew."""


class Fatal(Exception):
    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@dataclass
class WorkerConfig:
    gateway: str
    bootstrap_token: str
    executors: list[str] = field(default_factory=lambda: ["mock"])
    concurrency: int = 4
    handler_modules: list[str] = field(default_factory=list)
    name: str = ""
    shutdown_timeout_s: float = 30.0
    safety_margin_ms: int = 1000
    wait_ms: int = 20000
    backoff_min_ms: int = 100
    backoff_max_ms: int = 5000
    claim_on_complete: bool = True  # ask for the next lease with each completion (one round trip per task)
    batch: bool = True  # with concurrency > 1: send the results that are ready together (one request for many)
    ca_file: str | None = None  # PEM CA certificate(s) an https:// gateway's certificate must chain to

    def __post_init__(self) -> None:
        if not self.name:
            self.name = f"{socket.gethostname()}-{os.getpid()}"


class Backoff:
    """Exponential backoff with full jitter: sleep uniform(0, min(max, min * 2**n)); when the gateway said how long
    to wait (a 503's Retry-After), at least about that long (0.5-1 times it, jittered, at most 5 s)."""

    def __init__(self, min_ms: int, max_ms: int) -> None:
        self.min_s = max(min_ms, 1) / 1000.0
        self.max_s = max(max_ms, min_ms) / 1000.0
        self.failures = 0

    def reset(self) -> None:
        self.failures = 0

    def next_delay(self, retry_after_s: float | None = None) -> float:
        cap = min(self.max_s, self.min_s * (2**self.failures))
        self.failures = min(self.failures + 1, 30)
        delay = random.uniform(0, cap)
        if retry_after_s:
            delay = max(delay, random.uniform(0.5, 1.0) * min(retry_after_s, 5.0))
        return delay


def retry_after_of(error: BaseException) -> float | None:
    """The Retry-After (seconds) of a gateway's error answer, if it gave one."""
    return error.retry_after_s if isinstance(error, GatewayError) else None


class Execution:
    """One active lease: its deadlines (monotonic seconds), its task and why it was aborted, if it was."""

    def __init__(self, lease: dict[str, Any], claimed_at: float) -> None:
        self.lease = lease
        self.dispatch_id: str = lease["dispatch_id"]
        self.lease_token: str = lease["lease_token"]
        self.run_id: str = lease["run_id"]
        self.task_key: str = lease["task_key"]
        self.attempt: int = int(lease["attempt"])
        remaining_s = max(0, int(lease["lease_remaining_ms"])) / 1000.0
        # The attempt deadline as a duration after the lease's end (two server timestamps: only their difference
        # is used), added to the lease's remaining time, measured on our monotonic clock from ``claimed_at``.
        after_lease_s = _duration_s(lease.get("lease_expires_at"), lease.get("attempt_deadline"))
        self.attempt_deadline = claimed_at + remaining_s + after_lease_s
        self.margin_s = 0.0
        self.deadline = claimed_at + remaining_s
        self.abort_reason: str | None = None
        self.aborted = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        self.settled = False  # the server acknowledged its result (else, once it ends, it is reported dropped)
        self.live_output: list[dict[str, Any]] = []  # its last progress writes, sent with its result (docs/progress.md)

    def set_margin(self, margin_ms: int) -> None:
        """Apply the safety margin once, at claim time (the caller caps it at half the lease)."""
        self.margin_s = margin_ms / 1000.0
        self.deadline = min(self.deadline - self.margin_s, self.attempt_deadline - self.margin_s)

    def renew(self, lease_remaining_ms: int, sent_at: float) -> None:
        candidate = min(sent_at + lease_remaining_ms / 1000.0, self.attempt_deadline) - self.margin_s
        if candidate > self.deadline:
            self.deadline = candidate

    def abort(self, reason: str) -> None:
        if self.abort_reason is None:
            self.abort_reason = reason
        self.aborted.set()

    def describe(self) -> str:
        return f"{self.run_id}/{self.task_key}#{self.attempt} (dispatch {self.dispatch_id})"


def _batch_size(results: list[tuple[Execution, dict[str, Any], Any]]) -> int:
    """How many of the first ``results`` go in one completions request: at most MAX_BATCH, and at most
    MAX_BATCH_BYTES of JSON as the client encodes it (always at least one)."""
    total = 0
    for n, (ex, result, _) in enumerate(results[:MAX_BATCH]):
        total += len(json.dumps(result, separators=(",", ":"))) + len(ex.dispatch_id) + len(ex.lease_token) + 64
        if ex.live_output:  # its last progress writes ride along (docs/progress.md)
            total += len(json.dumps(ex.live_output, separators=(",", ":")))
        if n and total > MAX_BATCH_BYTES:
            return n
    return min(len(results), MAX_BATCH)


def _outage_error(error: ClientError) -> bool:
    """Whether a request failed because the gateway or the database is unreachable (no answer, 502/503/504):
    a result is kept and sent again after such a failure, never dropped for it (docs/protocol.md, Lease recovery)."""
    if isinstance(error, TransportError):
        return not isinstance(error, TlsVerifyError)  # a certificate that does not verify is no outage
    return isinstance(error, GatewayError) and error.status in (502, 503, 504)


def completion_verdict(error: GatewayError) -> str:
    """What a completion does with a gateway's error answer, one rule for a single result and a batch alike:
    ``"session"`` (the session is gone: the worker stops), ``"replace"`` (the result itself was refused: a
    permanent failure ``result_rejected`` is sent once in its place), ``"retry"`` (the gateway or the database may
    answer later: 5xx, 429) or ``"drop"`` (the lease is lost, the result conflicts with the one applied, or any other
    refusal: the same request would get the same answer)."""
    if error.code == SESSION_INVALID:
        return "session"
    if error.code in ("lease_lost", "result_conflict"):
        return "drop"
    if refuses_result(error.status, error.code):
        return "replace"
    return "retry" if error.retryable else "drop"


def _duration_s(start: Any, end: Any) -> float:
    """``end - start`` in seconds for two ISO timestamps from the server (0 when unknown)."""
    try:
        a = datetime.fromisoformat(str(start).replace("Z", "+00:00"))
        b = datetime.fromisoformat(str(end).replace("Z", "+00:00"))
    except (TypeError, ValueError):
        return 0.0
    return max(0.0, (b - a).total_seconds())


class Worker:
    def __init__(self, config: WorkerConfig, executors: dict[str, Executor] | None = None) -> None:
        self.config = config
        self.executors = (
            executors if executors is not None else build_executors(config.executors, config.handler_modules)
        )
        self.client = Client(config.gateway, timeout_s=30.0, ca_file=config.ca_file)
        self.worker_id = ""
        self.session_token = ""
        self.heartbeat_interval_s = 5.0
        self.lease_duration_ms = 15000
        self.margin_ms = config.safety_margin_ms
        self.executions: dict[str, Execution] = {}
        self.slot_freed = asyncio.Event()
        self.stopping = asyncio.Event()
        self.fatal: Fatal | None = None
        self.fatal_event = asyncio.Event()
        self._signals = 0
        self._heartbeat_failures = 0
        self._stopped_by_drain = False
        self._claim_task: asyncio.Task[None] | None = None
        self._ack_log = os.environ.get("AWP_WORKER_ACK_LOG") or None  # see the module docstring
        # Results waiting for the completer (batching): (execution, result, future of the leases for its slot).
        self._results: list[tuple[Execution, dict[str, Any], asyncio.Future[list[dict[str, Any]]]]] = []
        self._results_ready = asyncio.Event()
        # Handlers that did not return when cancelled: dispatch id -> (description, action). Each keeps its slot.
        self._hung: dict[str, tuple[str, str]] = {}
        self._all_hung_warned = False
        self._exiting = False
        self._counts = {"acknowledged": 0, "rejected": 0, "hung": 0}
        # Lease recovery (docs/protocol.md): every request that may claim is numbered (claim_seq); each heartbeat
        # says which have ended (claimed_through, claims_pending), so the server releases at once a lease whose
        # answer never arrived. Leases received but not started yet are held too (_in_hand), and leases given up
        # without an acknowledged result are reported as dropped (so they are not taken for lost answers) in the
        # next DROPPED_REPORTS successful heartbeats (the server marks them, skipping a row another transaction holds
        # at that instant: a later report marks it then): dispatch id -> [lease ref, successful reports so far].
        self._claim_seq = 0
        self._claims_pending: set[int] = set()
        self._in_hand: dict[str, dict[str, Any]] = {}
        self._dropped: dict[str, list[Any]] = {}
        self._heartbeats_ok = 0  # successful heartbeats so far (a held result waits for one after an outage)
        self._heartbeat_ok = asyncio.Event()  # set (and replaced) at each successful heartbeat
        # Live output of the handlers (ctx.progress / ctx.log / ctx.emit; docs/progress.md), batched per worker.
        self.output = ProgressSender(self.client, lambda: self.worker_id, lambda: self.session_token)

    @property
    def batching(self) -> bool:
        return self.config.batch and self.config.concurrency > 1

    # ---- entry point -------------------------------------------------------------------------------------

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, self._on_signal, sig)
        try:
            code = await self._run()
        finally:
            self._exiting = True
            await self.output.close()
            await self.client.close()
        self._log_summary(code)
        return code

    def _log_summary(self, code: int) -> None:
        """One line when the worker exits: its exit code, its results and its hung handlers."""
        hung = ", ".join(f"{action} ({where})" for where, action in self._hung.values())
        log.log(
            logging.WARNING if code else logging.INFO,
            "worker %s exiting with code %d: %d result(s) acknowledged, %d refused by the server and reported as"
            " result_rejected, %d handler(s) hung (%d still running%s)",
            self.worker_id or self.config.name,
            code,
            self._counts["acknowledged"],
            self._counts["rejected"],
            self._counts["hung"],
            len(self._hung),
            f": {hung}" if hung else "",
        )

    def _on_signal(self, sig: signal.Signals) -> None:
        self._signals += 1
        if self._signals > 1:
            log.warning("second %s: exiting at once", sig.name)
            logging.shutdown()
            os._exit(EXIT_SIGNAL)
        log.info("%s received: draining (stop claiming, finish %d active lease(s))", sig.name, len(self.executions))
        self.stopping.set()

    async def _run(self) -> int:
        try:
            registered = await self._register()
        except Fatal as e:
            log.error("%s", e)
            return e.exit_code
        if not registered:
            log.info("stopped before registering")
            return EXIT_OK
        heartbeat = asyncio.create_task(self._heartbeat_loop(), name="heartbeat")
        self._claim_task = asyncio.create_task(self._claim_loop(), name="claim")
        completer = asyncio.create_task(self._completer_loop(), name="completer")
        stop_wait = asyncio.create_task(self.stopping.wait())
        fatal_wait = asyncio.create_task(self.fatal_event.wait())
        try:
            await asyncio.wait({stop_wait, fatal_wait}, return_when=asyncio.FIRST_COMPLETED)
            if self.fatal is None:
                await self._drain()
        finally:
            for t in (stop_wait, fatal_wait, heartbeat, self._claim_task):
                t.cancel()
            await self._cancel_all("worker is exiting")
            completer.cancel()
            for t in (heartbeat, self._claim_task, completer):
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await t
        if self.fatal is not None:
            log.error("%s", self.fatal)
            return self.fatal.exit_code
        if self._hung:
            log.error(
                "%d hung handler(s) still running at the end of the drain: exiting with code %d (restart this worker)",
                len(self._hung),
                EXIT_HUNG,
            )
            return EXIT_HUNG
        return EXIT_OK

    def _set_fatal(self, exc: BaseException) -> None:
        if self.fatal is not None:
            return
        if isinstance(exc, SessionInvalid):
            self.fatal = Fatal(f"session invalid ({exc}): cancelled local work; exiting", EXIT_SESSION)
        elif isinstance(exc, Fatal):
            self.fatal = exc
        else:
            self.fatal = Fatal(f"unexpected error: {exc!r}", 1)
        for ex in list(self.executions.values()):
            ex.abort("worker session invalid")
        self.fatal_event.set()

    # ---- register ----------------------------------------------------------------------------------------

    async def _register(self) -> bool:
        """Register with the bootstrap token, retrying while the gateway is unreachable; False if stopped."""
        cfg = self.config
        backoff = Backoff(200, 5000)
        # Routing by action (docs/protocol.md): a python worker is given only the actions it has handlers for; the
        # mock executor runs every action (not listed).
        actions = {"python": registered_actions()} if "python" in self.executors else None
        while not self.stopping.is_set():
            try:
                answer = await self.client.register_worker(
                    cfg.bootstrap_token, cfg.name, list(self.executors), cfg.concurrency, actions
                )
            except TlsVerifyError as e:  # a configuration error, not an outage: waiting would not fix it
                raise Fatal(f"registration failed: {e}", EXIT_CONFIG) from e
            except TransportError as e:
                delay = backoff.next_delay()
                log.warning("gateway unreachable (%s); retrying registration in %.1fs", e, delay)
            except GatewayError as e:
                if e.status == 401:
                    raise Fatal(f"registration rejected: {e.code} (is the bootstrap token right?)", EXIT_CONFIG) from e
                if not e.retryable:
                    raise Fatal(f"registration failed: {e}", EXIT_CONFIG) from e
                delay = backoff.next_delay()
                log.warning("registration failed (%s); retrying in %.1fs", e, delay)
            else:
                self.worker_id = answer["worker_id"]
                self.session_token = answer["session_token"]
                self.heartbeat_interval_s = int(answer["heartbeat_interval_ms"]) / 1000.0
                self.lease_duration_ms = int(answer["lease_duration_ms"])
                self.margin_ms = max(0, min(cfg.safety_margin_ms, self.lease_duration_ms // 2))
                log.info(
                    "registered as %s (%s): executors %s%s, concurrency %d, heartbeat %dms, lease %dms, margin %dms",
                    self.worker_id,
                    cfg.name,
                    ",".join(self.executors),
                    f" (python actions: {', '.join(actions['python']) or 'none'})" if actions else "",
                    cfg.concurrency,
                    int(answer["heartbeat_interval_ms"]),
                    self.lease_duration_ms,
                    self.margin_ms,
                )
                return True
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), delay)
        return False

    # ---- claim loop --------------------------------------------------------------------------------------

    def _free_slots(self) -> int:
        return self.config.concurrency - len(self.executions) - len(self._hung)

    async def _claim_loop(self) -> None:
        cfg = self.config
        backoff = Backoff(cfg.backoff_min_ms, cfg.backoff_max_ms)
        try:
            while not self.stopping.is_set():
                free = self._free_slots()
                if free <= 0:
                    self.slot_freed.clear()
                    if self._free_slots() <= 0:
                        await self.slot_freed.wait()
                    continue
                sent_at = time.monotonic()
                seq = self._claim_begin()
                try:
                    leases = await self.client.claim(
                        self.worker_id, self.session_token, free, cfg.wait_ms, claim_seq=seq
                    )
                    # A long-poll may hold the request for seconds before the lease is issued, so durations are
                    # measured from the answer; the safety margin absorbs the answer's one-way latency.
                    received_at = time.monotonic()
                except (TransportError, GatewayError) as e:
                    self._claim_end(seq)  # ended without an answer: a lease it granted is one we never got
                    if isinstance(e, GatewayError) and e.code == SESSION_INVALID:
                        if not self.stopping.is_set():
                            raise SessionInvalid(e.message) from e
                        return
                    if isinstance(e, GatewayError) and e.code == "worker_draining":
                        if not self.stopping.is_set():  # not our own drain (SIGTERM): an operator's
                            log.info("the gateway says this worker is draining (drained by an operator): draining")
                        self.stopping.set()
                        return
                    delay = backoff.next_delay(retry_after_of(e))
                    level = (
                        logging.DEBUG
                        if isinstance(e, GatewayError) and e.code == "worker_capacity_exceeded"
                        else logging.WARNING
                    )
                    log.log(level, "claim failed (%s); retrying in %.2fs", e, delay)
                    await self._sleep_unless_stopping(delay)
                    continue
                self._claim_end(seq)  # its leases start right below, before anything else can run
                if leases:
                    backoff.reset()
                    for lease in leases:
                        self._start(lease, received_at)
                    continue
                elapsed_ms = (time.monotonic() - sent_at) * 1000
                if cfg.wait_ms == 0 or elapsed_ms < cfg.wait_ms / 2:  # no long-poll (or it ended early): back off
                    await self._sleep_unless_stopping(backoff.next_delay())
                else:
                    backoff.reset()
        except SessionInvalid as e:
            self._set_fatal(e)
        except Exception as e:  # a bug: exit loudly rather than idle forever without claiming
            log.exception("claim loop failed")
            self._set_fatal(e)

    def _claim_begin(self) -> int:
        """Number a request that may claim (docs/protocol.md, Lease recovery); it is pending until _claim_end."""
        self._claim_seq += 1
        self._claims_pending.add(self._claim_seq)
        return self._claim_seq

    def _claim_end(self, seq: int | None) -> None:
        """The request ``seq`` got its answer (whose leases are started or in hand) or never will."""
        if seq is not None:
            self._claims_pending.discard(seq)

    async def _sleep_unless_stopping(self, delay: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stopping.wait(), delay)

    def _start(self, lease: dict[str, Any], received_at: float) -> None:
        self._in_hand.pop(str(lease.get("dispatch_id")), None)
        ex = Execution(lease, received_at)
        lease_s = max(0, int(lease["lease_remaining_ms"]))
        ex.set_margin(min(self.margin_ms, lease_s // 2))
        self.executions[ex.dispatch_id] = ex
        log.info(
            "claimed %s: %s/%s, fencing %s, %.0fms to local deadline",
            ex.describe(),
            lease.get("executor_kind"),
            lease.get("action"),
            lease.get("fencing_token"),
            (ex.deadline - time.monotonic()) * 1000,
        )
        ex.task = asyncio.create_task(self._execute(ex), name=f"lease-{ex.dispatch_id}")

    # ---- one lease ---------------------------------------------------------------------------------------

    async def _execute(self, ex: Execution) -> None:
        leases: list[dict[str, Any]] = []
        try:
            result = await self._run_executor(ex)
            if result is not None and ex.abort_reason is None:
                if self.batching:
                    done: asyncio.Future[list[dict[str, Any]]] = asyncio.get_running_loop().create_future()
                    self._results.append((ex, result, done))
                    self._results_ready.set()
                    leases = await done  # the slot stays taken until the result is acknowledged or dropped
                else:
                    leases = await self._complete(ex, result)
        except SessionInvalid as e:
            self._set_fatal(e)
        except Exception as e:
            log.exception("lease %s: unexpected error", ex.describe())
            self._set_fatal(e)
        finally:
            self.executions.pop(ex.dispatch_id, None)
            if not ex.settled:  # no result acknowledged: the next heartbeats report the lease dropped
                self._dropped[ex.dispatch_id] = [{"dispatch_id": ex.dispatch_id, "lease_token": ex.lease_token}, 0]
            # Leases that rode on the completion take over this slot at once; otherwise the claim loop wakes.
            received_at = time.monotonic()
            for lease in leases:
                self._start(lease, received_at)
            if not leases:
                self.slot_freed.set()

    async def _run_executor(self, ex: Execution) -> dict[str, Any] | None:
        lease = ex.lease
        executor = self.executors.get(str(lease.get("executor_kind")))
        if executor is None:
            return failure(
                "permanent_failure", "unknown_executor", f"this worker has no executor {lease.get('executor_kind')!r}"
            )
        ctx = Context(
            run_id=ex.run_id,
            task_key=ex.task_key,
            attempt=ex.attempt,
            fencing_token=int(lease.get("fencing_token") or 0),
            workflow_id=str(lease.get("workflow_id", "")),
            action=str(lease.get("action", "")),
            deadline=ex.attempt_deadline - ex.margin_s,
            run_input=lease.get("run_input") or {},
            upstream=lease.get("upstream") or {},
            item=lease.get("item"),
            item_index=lease.get("item_index"),
            _deadline_fn=lambda: ex.deadline,
            _output=(output := self.output.open(ex.dispatch_id, ex.lease_token)),
        )
        work = asyncio.create_task(executor.execute(ctx.action, lease.get("input"), ctx))
        aborted: asyncio.Task[Any] | None = None
        try:
            # A handler that returns without waiting is done after one turn of the loop: then no watcher is needed
            # (one task and one asyncio.wait less per lease); otherwise watch for the deadline and an abort.
            await asyncio.sleep(0)
            while True:
                remaining = ex.deadline - time.monotonic()
                if remaining <= 0:
                    ex.abort("local safety deadline passed")
                    break
                if work.done() or ex.aborted.is_set():
                    break
                if aborted is None:
                    aborted = asyncio.create_task(ex.aborted.wait())
                done, _ = await asyncio.wait({work, aborted}, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
                if work in done or aborted in done:
                    break
        finally:
            if aborted is not None:
                aborted.cancel()
            if not work.done():
                work.cancel()
                await asyncio.wait({work}, timeout=HUNG_GRACE_S)
                if work.done():
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await work
                else:  # registered before _execute frees the lease's slot: the hung handler keeps it
                    self._handler_hung(ex, work)
        if ex.abort_reason is not None:
            self.output.discard(output)
            log.warning("lease %s: %s; execution cancelled, not completing", ex.describe(), ex.abort_reason)
            return None
        ex.live_output = await self.output.finish(output)  # sent with the result, written before it (docs/progress.md)
        try:
            result = work.result()
        except asyncio.CancelledError:
            return None
        except Exception as e:
            log.warning("lease %s: executor error %r", ex.describe(), e)
            result = failure("temporary_failure", "executor_error", repr(e))
        return check_result(result)

    def _handler_hung(self, ex: Execution, work: asyncio.Task[Any]) -> None:
        """A cancelled handler that has not returned keeps its slot until it does (docs/operations.md)."""
        action = str(ex.lease.get("action", ""))
        self._hung[ex.dispatch_id] = (ex.describe(), action)
        self._counts["hung"] += 1
        since = time.monotonic()
        log.warning(
            "lease %s: handler %r has not returned %.1fs after it was cancelled (%s); its slot stays taken until it"
            " does (%d of %d slot(s) hold hung handlers)",
            ex.describe(),
            action,
            HUNG_GRACE_S,
            ex.abort_reason,
            len(self._hung),
            self.config.concurrency,
        )
        if len(self._hung) >= self.config.concurrency and not self._all_hung_warned:
            self._all_hung_warned = True
            log.warning(
                "every slot (%d of %d) holds a hung handler: this worker claims nothing until one returns; restart it"
                " (on SIGTERM it exits with code %d at the end of its drain deadline)",
                len(self._hung),
                self.config.concurrency,
                EXIT_HUNG,
            )
        work.add_done_callback(lambda _: self._hung_returned(ex, since))

    def _hung_returned(self, ex: Execution, since: float) -> None:
        if self._exiting:  # the event loop is closing: this is its cancellation, not the handler's return
            return
        self._hung.pop(ex.dispatch_id, None)
        self._all_hung_warned = False
        log.info(
            "lease %s: the hung handler returned %.1fs later; its slot is free again",
            ex.describe(),
            time.monotonic() - since,
        )
        self.slot_freed.set()

    async def _complete(self, ex: Execution, result: dict[str, Any]) -> list[dict[str, Any]]:
        """Report the result; retried with the same lease and result until the gateway answers for good.

        The first try also asks for one new lease for the slot it frees (docs/protocol.md, claim on complete: one round
        trip per task), unless the worker is stopping; retries ask for none, so a lost answer strands at most one lease.
        Returns the new leases.
        """
        backoff = Backoff(100, 2000)
        replaced = False
        claim_slots = 0 if self.stopping.is_set() or not self.config.claim_on_complete else 1
        while True:
            if ex.abort_reason is not None:
                log.warning("lease %s: %s while completing; dropping the result", ex.describe(), ex.abort_reason)
                return []
            wait_s: float | None = None
            outage = False
            seq = self._claim_begin() if claim_slots else None
            try:
                applied, leases = await self.client.complete(
                    self.worker_id,
                    self.session_token,
                    ex.dispatch_id,
                    ex.lease_token,
                    result,
                    claim_slots=claim_slots if claim_slots else None,
                    claim_seq=seq,
                    live_output=ex.live_output,
                )
            except TransportError as e:
                reason, outage = str(e), True
            except GatewayError as e:
                verdict = completion_verdict(e)
                if verdict == "session":
                    raise SessionInvalid(e.message) from e
                if verdict == "replace":
                    if replaced:  # never a loop: the replacement itself was refused
                        log.error("lease %s: the server refused result_rejected too (%s); dropped", ex.describe(), e)
                        return []
                    replaced = True
                    result = self._rejected(ex, e.status, e.code, e.message)
                    continue  # at once: the refused request changed nothing (and claimed nothing)
                if verdict == "drop":
                    log.warning("lease %s: complete answered %s (%s); dropped", ex.describe(), e.code, e.message)
                    return []
                reason, wait_s, outage = str(e), e.retry_after_s, _outage_error(e)
            else:
                log.info(
                    "completed %s: %s%s",
                    ex.describe(),
                    result["kind"],
                    "" if applied else " (not applied)",
                )
                self._record_ack(ex, result, applied)
                self._counts["acknowledged"] += 1
                return leases
            finally:  # before anything else runs: the leases of an answer start as soon as this returns
                self._claim_end(seq)
            claim_slots = 0
            # The server's lease ends at most one margin after our local deadline: past that, a retry can only
            # answer lease_lost (or repeat an applied answer), so stop holding the slot. Not so while the gateway or
            # the database is unreachable (an outage): lease time does not run while no coordinator can work, so the
            # result is kept and sent again once they are back (docs/protocol.md, Lease recovery).
            if time.monotonic() > ex.deadline + ex.margin_s + 1.0 and not outage:
                log.warning("lease %s: complete failed (%s) and the lease has expired; dropped", ex.describe(), reason)
                return []
            seen = self._heartbeats_ok
            delay = backoff.next_delay(wait_s)
            log.warning("lease %s: complete failed (%s); retrying in %.2fs", ex.describe(), reason, delay)
            await asyncio.sleep(delay)
            if outage:  # let a heartbeat renew the lease first (or revoke it: then the result is dropped above)
                await self._heartbeat_after(seen)

    # ---- batched completions -----------------------------------------------------------------------------

    async def _completer_loop(self) -> None:
        """Send the results that are ready, many per request (POST .../completions): while one request is in
        flight the next results gather, so a busy worker needs about one request per batch instead of one per
        task, and an idle one sends each result at once (no added delay)."""
        try:
            while True:
                await self._results_ready.wait()
                self._results_ready.clear()
                while self._results:
                    n = _batch_size(self._results)
                    batch, self._results = self._results[:n], self._results[n:]
                    await self._complete_batch(batch)
        except SessionInvalid as e:
            self._set_fatal(e)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a bug: exit loudly rather than hold every slot forever
            log.exception("completer failed")
            self._set_fatal(e)
        finally:
            for _, _, done in self._results:
                if not done.done():
                    done.set_result([])

    async def _complete_batch(
        self, batch: list[tuple[Execution, dict[str, Any], asyncio.Future[list[dict[str, Any]]]]]
    ) -> None:
        """Report a batch of results; like :meth:`_complete`, retried until answered for good, the first try
        asking for one new lease per freed slot, retries for none. Each result's future gets its slot's leases."""
        backoff = Backoff(100, 2000)
        claim_slots = 0 if self.stopping.is_set() or not self.config.claim_on_complete else len(batch)
        pending = list(batch)
        replaced: set[str] = set()  # dispatch ids whose result was refused once and replaced by result_rejected
        try:
            while pending:
                for item in [i for i in pending if i[0].abort_reason is not None]:
                    log.warning(
                        "lease %s: %s while completing; dropping the result", item[0].describe(), item[0].abort_reason
                    )
                    pending.remove(item)
                    item[2].set_result([])
                if not pending:
                    return
                items: list[dict[str, Any]] = [
                    {"dispatch_id": ex.dispatch_id, "lease_token": ex.lease_token, "result": r} for ex, r, _ in pending
                ]
                for body, (ex, _, _) in zip(items, pending, strict=True):
                    if ex.live_output:  # its last progress writes (docs/progress.md)
                        body["live_output"] = ex.live_output
                seq = self._claim_begin() if claim_slots else None
                try:
                    answers, leases = await self.client.complete_many(
                        self.worker_id, self.session_token, items, claim_slots, claim_seq=seq
                    )
                except (TransportError, GatewayError) as e:
                    self._claim_end(seq)
                    verdict = completion_verdict(e) if isinstance(e, GatewayError) else "retry"
                    if isinstance(e, GatewayError) and verdict == "session":
                        raise SessionInvalid(e.message) from e
                    if isinstance(e, GatewayError) and verdict == "replace":
                        if len(pending) > 1:  # which result? each on its own (a refused one is then replaced)
                            log.warning(
                                "%d result(s): completions refused (%s); sending them one by one", len(pending), e
                            )
                            for item in pending:
                                await self._complete_batch([item])
                            return
                        ex, _, done = pending[0]
                        if ex.dispatch_id not in replaced:
                            replaced.add(ex.dispatch_id)
                            pending[0] = (ex, self._rejected(ex, e.status, e.code, e.message), done)
                            continue
                        verdict = "drop"  # never a loop: the replacement itself was refused
                    if verdict == "drop":
                        for ex, _, done in pending:
                            log.warning("lease %s: completions answered %s; dropped", ex.describe(), e)
                            done.set_result([])
                        return
                    claim_slots = 0
                    now = time.monotonic()
                    outage = _outage_error(e)  # results are kept through an outage, as in _complete
                    for item in [i for i in pending if not outage and now > i[0].deadline + i[0].margin_s + 1.0]:
                        log.warning(
                            "lease %s: complete failed (%s) and the lease has expired; dropped", item[0].describe(), e
                        )
                        pending.remove(item)
                        item[2].set_result([])
                    seen = self._heartbeats_ok
                    delay = backoff.next_delay(retry_after_of(e))
                    log.warning("%d result(s): complete failed (%s); retrying in %.2fs", len(pending), e, delay)
                    await asyncio.sleep(delay)
                    if outage:
                        await self._heartbeat_after(seen)
                    continue
                for lease in leases:  # held from now on (listed in heartbeats) until their slots start them
                    self._in_hand[str(lease["dispatch_id"])] = lease
                self._claim_end(seq)
                by_id = {a.get("dispatch_id"): a for a in answers}
                refused = []
                for ex, result, done in pending:
                    answer = by_id.get(ex.dispatch_id) or {}
                    error = answer.get("error")
                    if error is None:
                        log.info("completed %s: %s", ex.describe(), result["kind"])
                        self._record_ack(ex, result, True)
                        self._counts["acknowledged"] += 1
                    elif error.get("code") == "invalid_request" and ex.dispatch_id not in replaced:
                        replaced.add(ex.dispatch_id)  # sent again below, once, as result_rejected
                        refused.append(
                            (ex, self._rejected(ex, 400, "invalid_request", str(error.get("message"))), done)
                        )
                        continue
                    else:
                        log.warning(
                            "lease %s: complete answered %s (%s); dropped",
                            ex.describe(),
                            error.get("code"),
                            error.get("message"),
                        )
                    done.set_result([leases.pop(0)] if leases else [])
                for (
                    lease
                ) in leases:  # more leases than results cannot happen (claim_slots <= results); never strand one
                    self._start(lease, time.monotonic())
                if not refused:
                    return
                pending, claim_slots = refused, 0
            return
        finally:
            for _, _, done in batch:
                if not done.done():
                    done.set_result([])

    def _rejected(self, ex: Execution, status: int, code: str, message: str) -> dict[str, Any]:
        """The permanent failure sent (once) in place of a result the server refused for good."""
        self._counts["rejected"] += 1
        log.warning(
            "lease %s: the server refused the result (%d %s: %s); reporting a permanent failure result_rejected",
            ex.describe(),
            status,
            code,
            message,
        )
        return rejected(status, code, message)

    def _record_ack(self, ex: Execution, result: dict[str, Any], applied: bool) -> None:
        """Append an acknowledged completion to ``AWP_WORKER_ACK_LOG`` (when set)."""
        ex.settled = True
        if self._ack_log is None:
            return
        line = json.dumps(
            {
                "dispatch_id": ex.dispatch_id,
                "run_id": ex.run_id,
                "task_key": ex.task_key,
                "attempt": ex.attempt,
                "fencing_token": ex.lease.get("fencing_token"),
                "kind": result.get("kind"),
                "applied": applied,
            }
        )
        try:
            with open(self._ack_log, "a", encoding="utf-8") as f:
                f.write(line + "\n")
        except OSError as e:  # a test aid: never let it break a worker
            log.warning("cannot append to AWP_WORKER_ACK_LOG %s: %s", self._ack_log, e)

    # ---- heartbeat loop ----------------------------------------------------------------------------------

    async def _heartbeat_loop(self) -> None:
        interval = self.heartbeat_interval_s
        try:
            while True:
                sent_at = time.monotonic()
                await self._heartbeat_once(sent_at, timeout_s=max(1.0, 2 * interval))
                delay = interval - (time.monotonic() - sent_at)
                if delay > 0:
                    await asyncio.sleep(delay)
        except SessionInvalid as e:
            self._set_fatal(e)
        except Exception as e:  # a bug: exit loudly rather than let every lease expire silently
            log.exception("heartbeat loop failed")
            self._set_fatal(e)

    async def _heartbeat_once(self, sent_at: float, timeout_s: float) -> None:
        active = list(self.executions.values())
        leases = [{"dispatch_id": ex.dispatch_id, "lease_token": ex.lease_token} for ex in active]
        # Lease recovery (docs/protocol.md): every lease held (running, its result being sent, or received and not
        # started yet) is listed; claimed_through and claims_pending say which claim requests have ended, so the
        # server releases a lease those gave us that we do not list (a lost answer). Composed in one go (no await):
        # a request that ends after this is still pending here, so no lease of its answer can be released by it.
        leases += [{"dispatch_id": x["dispatch_id"], "lease_token": x["lease_token"]} for x in self._in_hand.values()]
        dropped = [ref for ref, _ in self._dropped.values()]
        try:
            answers, worker_status = await self.client.heartbeat(
                self.worker_id,
                self.session_token,
                leases,
                timeout_s=timeout_s,
                claimed_through=self._claim_seq,
                claims_pending=sorted(self._claims_pending),
                dropped=dropped,
            )
        except GatewayError as e:
            if e.code == SESSION_INVALID:
                if self.stopping.is_set():  # our own drain may have just stopped it: the drain call decides
                    return
                raise SessionInvalid(e.message) from e
            self._heartbeat_failed(e)
            return
        except ClientError as e:
            self._heartbeat_failed(e)
            return
        if self._heartbeat_failures:
            log.info("heartbeat recovered after %d failure(s)", self._heartbeat_failures)
            self._heartbeat_failures = 0
        for ref in dropped:  # marked by the server (or, rarely, at one of the next reports)
            entry = self._dropped.get(ref["dispatch_id"])
            if entry is not None:
                entry[1] += 1
                if entry[1] >= DROPPED_REPORTS:
                    del self._dropped[ref["dispatch_id"]]
        self._heartbeats_ok += 1
        self._heartbeat_ok.set()
        self._heartbeat_ok = asyncio.Event()
        if worker_status == "draining" and not self.stopping.is_set():
            log.info(
                "an operator drained this worker: draining (stop claiming, finish %d active lease(s))",
                len(self.executions),
            )
            self.stopping.set()
        by_id = {ex.dispatch_id: ex for ex in active}
        for answer in answers:
            ex = by_id.get(answer.get("dispatch_id", ""))
            if ex is None:
                continue
            status = answer.get("status")
            if status == "renewed":
                ex.renew(int(answer.get("lease_remaining_ms") or 0), sent_at)
            elif status in ("revoked", "unknown"):
                ex.abort(f"heartbeat answered {status}")

    async def _heartbeat_after(self, seen: int) -> None:
        """Wait (at most a few heartbeat intervals) for a heartbeat to succeed after the ``seen``-th one: after an
        outage a held result's lease is renewed (or revoked) by it before the result is sent again."""
        end = time.monotonic() + max(2.0, 4 * self.heartbeat_interval_s)
        while self._heartbeats_ok <= seen:
            remaining = end - time.monotonic()
            if remaining <= 0:
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._heartbeat_ok.wait(), remaining)

    def _heartbeat_failed(self, error: Exception) -> None:
        """Log the first failure of a streak and then every 20th (the loop keeps trying every interval)."""
        self._heartbeat_failures += 1
        if self._heartbeat_failures % 20 == 1:
            log.warning("heartbeat failed (%d in a row): %s", self._heartbeat_failures, error)

    # ---- shutdown ----------------------------------------------------------------------------------------

    async def _drain(self) -> None:
        timeout = self.config.shutdown_timeout_s
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        summary = await self._call_drain(end)
        if self.fatal_event.is_set():
            return
        if summary is not None:
            log.info("drain: worker %s is %s", self.worker_id, summary.get("status"))
            if summary.get("status") == "stopped":
                self._stopped_by_drain = True
        # An in-flight claim may still hand us leases (committed before the drain): wait for its answer.
        if self._claim_task is not None and not self._claim_task.done():
            with contextlib.suppress(TimeoutError, asyncio.CancelledError, Exception):
                await asyncio.wait_for(asyncio.shield(self._claim_task), max(0.0, end - loop.time()))
        while (self.executions or self._hung) and loop.time() < end and not self.fatal_event.is_set():
            self.slot_freed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.slot_freed.wait(), max(0.01, end - loop.time()))
        if self.fatal_event.is_set():
            return
        if self.executions:
            abandoned = list(self.executions.values())
            log.warning(
                "shutdown timeout (%.1fs) passed with %d active lease(s): cancelling and releasing them",
                timeout,
                len(abandoned),
            )
            await self._cancel_all("shutdown timeout passed")
            await self._release_all([ex for ex in abandoned if not ex.settled], max(end, loop.time() + 5.0))
        if not self._stopped_by_drain:
            summary = await self._call_drain(max(end, loop.time() + 5.0))
            if summary is not None:
                self._stopped_by_drain = summary.get("status") == "stopped"
                log.info("drain: worker %s is %s", self.worker_id, summary.get("status"))

    async def _call_drain(self, end: float) -> dict[str, Any] | None:
        loop = asyncio.get_running_loop()
        backoff = Backoff(100, 1000)
        while True:
            try:
                return await self.client.drain(self.worker_id, self.session_token)
            except GatewayError as e:
                if e.code == SESSION_INVALID:  # e.g. marked offline while the gateway was unreachable
                    self._set_fatal(SessionInvalid(e.message))
                    return None
                if not e.retryable:
                    log.error("drain failed: %s", e)
                    return None
                reason = str(e)
            except TransportError as e:
                reason = str(e)
            delay = backoff.next_delay()
            if loop.time() + delay > end:
                log.warning("drain failed (%s); giving up", reason)
                return None
            log.warning("drain failed (%s); retrying in %.2fs", reason, delay)
            await asyncio.sleep(delay)

    async def _release_all(self, abandoned: list[Execution], end: float) -> None:
        """Give back the leases the drain abandoned (docs/protocol.md, Drain): each task is due again at once, on
        another worker, its attempt not counted against max_attempts. A lease that cannot be released by ``end``
        (the gateway is unreachable) ends at its expiry as before."""
        loop = asyncio.get_running_loop()
        for ex in abandoned:
            backoff = Backoff(100, 1000)
            while True:
                try:
                    answer = await self.client.release(
                        self.worker_id, self.session_token, ex.dispatch_id, ex.lease_token
                    )
                except GatewayError as e:
                    if not e.retryable:  # lease_lost: completed, expired or canceled meanwhile; nothing to give back
                        log.info("lease %s: not released (%s: %s)", ex.describe(), e.code, e.message)
                        break
                    reason = str(e)
                except TransportError as e:
                    reason = str(e)
                else:
                    self._dropped.pop(ex.dispatch_id, None)  # released: nothing left to report
                    log.info(
                        "released %s: its task is %s, due again at once (this attempt does not count)",
                        ex.describe(),
                        answer.get("task_status"),
                    )
                    break
                delay = backoff.next_delay()
                if loop.time() + delay > end:
                    log.warning("lease %s: release failed (%s); it ends at its expiry", ex.describe(), reason)
                    break
                await asyncio.sleep(delay)

    async def _cancel_all(self, reason: str) -> None:
        tasks = []
        for ex in list(self.executions.values()):
            ex.abort(reason)
            if ex.task is not None:
                tasks.append(ex.task)
        if tasks:
            await asyncio.wait(tasks, timeout=5.0)


def run_worker(config: WorkerConfig) -> int:
    """Run a worker until drained or failed; returns the process exit code."""
    try:
        worker_executors = build_executors(config.executors, config.handler_modules, config.concurrency)
        client_ssl_context(config.ca_file)  # an unreadable --ca-file fails here, not in the event loop
    except (ValueError, ImportError, OSError) as e:  # ssl.SSLError is an OSError
        log.error("bad configuration: %s", e)
        return EXIT_CONFIG

    async def main() -> int:
        return await Worker(config, worker_executors).run()

    try:
        code = eventloop.run(main())
    except KeyboardInterrupt:
        code = EXIT_SIGNAL
    stuck = [t.name for t in threading.enumerate() if t.name.startswith(HANDLER_THREAD_PREFIX) and t.is_alive()]
    if stuck:  # cancelled sync handlers still running: a thread cannot be stopped, so do not wait for it
        log.warning("%d sync handler thread(s) still running; exiting without waiting for them", len(stuck))
        logging.shutdown()
        os._exit(code)
    return code
