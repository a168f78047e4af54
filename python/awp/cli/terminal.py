"""Terminal rendering shared by the ``awp`` commands and ``awp demo``: status colours, run and task tables,
task details, wait reasons, the cluster status screen, and the live progress of a run (:func:`watch_run`)."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from contextlib import nullcontext
from datetime import datetime
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from awp.protocol.statuses import RUN_TERMINAL, TASK_DONE, TASK_STATUSES
from awp.worker.client import Client

TickHook = Callable[[dict[str, Any], list[dict[str, Any]]], Awaitable[None]]


STATUS_STYLE = {
    "succeeded": "green",
    "running": "cyan",
    "queued": "blue",
    "ready": "blue",
    "waiting_retry": "yellow",
    "waiting_dependencies": "dim",
    "failed": "red",
    "skipped": "magenta",
    "canceled": "magenta",
    "pending": "dim",
    "active": "green",
    "draining": "yellow",
    "stopped": "dim",
    "offline": "red",
    "interrupted": "yellow",
    "timed_out": "red",
}


def styled(status: str | None) -> Text:
    s = status or "-"
    return Text(s, style=STATUS_STYLE.get(s, ""))


def task_lines(run_id: str, task: dict[str, Any], worker_names: dict[str, str], width: int = 100) -> list[Text]:
    """The lines of ``awp run task``: the task, then each attempt with its error and an output preview."""
    head = Text(f"task {task.get('task_key')}  ", style="bold")
    head.append_text(styled(task.get("status")))
    head.append(f"  run {run_id}  attempts {task.get('attempts', 0)}/{task.get('max_attempts', '?')}")
    lines = [head]
    action = f"  action {task['action']}" if task.get("action") else ""
    timeout = f"  timeout {task['timeout_ms']} ms" if task.get("timeout_ms") else ""
    priority = f"  priority {task['priority']}" if task.get("priority") not in (None, 5) else ""
    lines.append(Text(f"executor {task.get('executor') or '-'}{action}{timeout}{priority}"))
    if task.get("limits"):  # its rate-limit buckets (docs/limits.md)
        lines.append(Text(f"limits {', '.join(task['limits'])}"))
    deps = task.get("depends_on") or []
    lines.append(Text(f"depends on {', '.join(deps)}" if deps else "depends on nothing (a root task)"))
    if task.get("wait_reason"):
        lines.append(
            Text(f"waiting: {task['wait_reason']}: {task.get('wait_detail') or ''}".rstrip(": "), style="yellow")
        )
    history = task.get("attempt_history") or []
    if not history:
        lines.append(Text("no attempt yet", style="dim"))
    for a in history:
        line = Text(f"#{a.get('attempt')}  ", style="bold")
        line.append_text(styled(a.get("status")))
        worker_id = a.get("worker_id")
        if worker_id:
            name = worker_names.get(str(worker_id))
            line.append(f"  on {name} ({worker_id})" if name else f"  on {worker_id}")
        started, finished = parse_time(a.get("started_at")), parse_time(a.get("finished_at"))
        line.append(f"  started {short_time(a.get('started_at'))}")
        if finished is not None:
            line.append(f"  finished {short_time(a.get('finished_at'))}")
            if started is not None:
                line.append(f"  took {max(0.0, (finished - started).total_seconds()):.2f}s")
        elif a.get("deadline"):
            line.append(f"  deadline {short_time(a.get('deadline'))}")
        lines.append(line)
        if a.get("error_code") or a.get("error_message"):
            error = Text("    error ", style="red")
            error.append(str(a.get("error_code") or "-"))
            if a.get("error_message"):
                error.append(f": {a.get('error_message')}")
            lines.append(error)
            if a.get("error_detail"):  # a handler's traceback (migration 0018), as the worker sent it
                lines.extend(
                    Text("      " + line, style="dim") for line in str(a["error_detail"]).rstrip().splitlines()
                )
        if a.get("output") is not None or a.get("status") == "succeeded":
            prefix = "    output "
            lines.append(Text(prefix + preview(a.get("output"), max(20, width - len(prefix)))))
    return lines


def preview(value: Any, limit: int) -> str:
    """Compact JSON of ``value``, cut to ``limit`` characters (ending with …)."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def cancel_message(answer: dict[str, Any]) -> str:
    """What a cancel request did, from its answer (a finished run is returned unchanged)."""
    run_id, status, requested = answer.get("run_id"), answer.get("status"), answer.get("cancel_requested_at")
    if status == "canceled":
        return f"run {run_id} canceled" + (f" (cancel requested at {requested})" if requested else "")
    if status in RUN_TERMINAL or not requested:
        return f"run {run_id} already {status}; nothing to cancel"
    return f"run {run_id} {status}; cancel requested at {requested} (it converges shortly)"


def status_lines(s: dict[str, Any]) -> list[Any]:
    """The lines (and one table) of ``awp status`` from ``GET /api/v1/status``."""
    workers, runs, dispatches = s.get("workers") or {}, s.get("runs") or {}, s.get("dispatches") or {}
    limit = int(s.get("dispatch_limit") or 0)
    live = int(dispatches.get("pending", 0)) + int(dispatches.get("leased", 0))
    out: list[Any] = [
        Text(
            f"workers  {workers.get('active', 0)} active, {workers.get('draining', 0)} draining"
            f"    runs  {runs.get('running', 0)} running, {runs.get('pending', 0)} pending",
            style="bold",
        ),
        Text(
            f"in flight  {dispatches.get('leased', 0)} leased + {dispatches.get('pending', 0)} pending = {live}"
            f" of dispatch_limit {limit}" + ("  (reached)" if limit and live >= limit else "")
        ),
    ]
    table = Table("executor", "workers", "slots", "busy", "free", "leased", "pending", "ready", "held by", box=None)
    for kind, k in sorted((s.get("executors") or {}).items()):
        slots, free = int(k.get("slots", 0)), int(k.get("free_slots", 0))
        ready, pending = int(k.get("ready", 0)), int(k.get("pending", 0))
        if not k.get("workers"):
            held = Text("no active worker offers it", style="red") if ready or pending else Text("")
        elif ready and limit and live >= limit:
            held = Text("dispatch_limit", style="yellow")
        elif ready and free - pending <= 0:
            held = Text("workers full", style="yellow")
        else:
            held = Text("")
        table.add_row(
            kind,
            str(k.get("workers", 0)),
            str(slots),
            str(slots - free),
            str(free),
            str(k.get("leased", 0)),
            str(pending),
            str(ready),
            held,
        )
    out.append(table)
    oldest = s.get("oldest_waiting")
    if oldest:
        since = parse_time(oldest.get("since"))
        age = ""
        if since is not None:
            age = f" for {max(0.0, (datetime.now(since.tzinfo) - since).total_seconds()):.1f}s"
        line = Text("oldest waiting  ", style="bold")
        line.append(f"{oldest.get('task_key')} of run {oldest.get('run_id')} ({oldest.get('status')}{age})")
        out.append(line)
        why = Text("  why  ", style="bold")
        why.append(f"{oldest.get('reason')}: {oldest.get('detail')}", style="yellow")
        out.append(why)
    else:
        out.append(Text("no task is waiting for a worker", style="dim"))
    tick = parse_time(s.get("last_tick_at"))
    if tick is None:
        out.append(Text("no coordinator pass yet: is `awp serve` running?", style="red"))
    else:
        ago = max(0.0, (datetime.now(tick.tzinfo) - tick).total_seconds())
        out.append(Text(f"last coordinator pass {ago:.1f}s ago", style="red" if ago > 10 else "dim"))
    return out


def workers_table(items: list[dict[str, Any]]) -> Table:
    table = Table("worker", "name", "status", "executors", "leases", "last heartbeat", box=None)
    for w in items:
        table.add_row(
            str(w.get("worker_id")),
            str(w.get("display_name")),
            styled(w.get("status")),
            ",".join(w.get("executor_kinds") or []),
            f"{w.get('active_leases', 0)}/{w.get('max_concurrency', '?')}",
            short_time(w.get("last_heartbeat_at")),
        )
    return table


def schedule_trigger(s: dict[str, Any]) -> str:
    if s.get("cron"):
        return f"cron '{s['cron']}' ({s.get('timezone') or 'UTC'})"
    return f"every {s.get('interval_ms')} ms"


def short_time(value: Any) -> str:
    if not value:
        return "-"
    text = str(value)
    return text[11:23] if len(text) >= 19 and text[10] in "T " else text


def run_header(info: dict[str, Any]) -> Text:
    text = Text()
    text.append(f"run {info.get('run_id')}  ", style="bold")
    text.append(f"{info.get('workflow_id')} v{info.get('workflow_version')}  ")
    text.append_text(styled(info.get("status")))
    text.append(f"  revision {info.get('revision')}")
    if info.get("cancel_requested_at"):
        text.append("  (cancel requested)", style="magenta")
    waiting = waiting_text(info)
    if waiting:
        text.append("\n" + waiting, style="yellow")
    return text


# Short labels of the wait reason codes (awp.run_waits; docs/limits.md).
WAIT_LABELS = {
    "cancel_requested": "cancel requested",
    "waiting_dependencies": "waiting for dependencies",
    "waiting_retry": "waiting for a retry",
    "no_worker_for_executor": "no worker offers the executor",
    "no_worker_for_action": "no worker runs the action",
    "run_concurrency": "run concurrency reached",
    "dispatch_limit": "global dispatch_limit reached",
    "workers_full": "every worker of the kind is full",
    "fairness": "queued behind other runs",
    "waiting_for_dispatch": "about to be dispatched",
    "waiting_for_claim": "dispatched, waiting for a claim",
    "waiting_signal": "waiting for a signal",
    "sleeping": "sleeping",
    "rate_limited": "held by a rate limit",
}


def waiting_text(info: dict[str, Any]) -> str:
    """What holds the run's waiting tasks: 'waiting for a worker with executor python' while ready tasks have no
    worker that could take them, and the run's ``waiting`` counts by reason code, most first, the first one
    explained: 'waiting: 1800 workers_full (every worker of the kind is full), 200 waiting_for_claim'. Tasks
    waiting for their dependencies or for the next coordinator pass are left out (nothing holds them)."""
    parts = []
    kinds = [str(k) for k in info.get("waiting_for_executors") or []]
    if kinds:
        parts.append(f"waiting for a worker with executor {', '.join(kinds)}")
    skip = {"waiting_dependencies", "waiting_for_dispatch"} | ({"no_worker_for_executor"} if kinds else set())
    waits = {str(k): int(v) for k, v in (info.get("waiting") or {}).items() if k not in skip and v}
    if waits:
        ordered = sorted(waits.items(), key=lambda kv: (-kv[1], kv[0]))
        (code, n), rest = ordered[0], ordered[1:]
        first = f"{n} {code}" + (f" ({WAIT_LABELS[code]})" if code in WAIT_LABELS else "")
        parts.append("waiting: " + ", ".join([first, *(f"{m} {k}" for k, m in rest)]))
    return "; ".join(parts)


def wait_lines(tasks: list[dict[str, Any]]) -> list[Text]:
    """One line per wait reason among ``tasks`` (rows of run_tasks): how many, and the first one's detail."""
    first: dict[str, dict[str, Any]] = {}
    counts: Counter[str] = Counter()
    for t in tasks:
        reason = t.get("wait_reason")
        if reason:
            counts[str(reason)] += 1
            first.setdefault(str(reason), t)
    lines = []
    for reason, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        t = first[reason]
        line = Text(f"{reason} ", style="yellow")
        line.append(f"{n} task{'s' if n != 1 else ''}, e.g. {t.get('task_key')}: {t.get('wait_detail') or ''}")
        lines.append(line)
    return lines


def dynamic_status(t: dict[str, Any]) -> Text:
    """A task's status, with what dynamic workflows add (docs/dynamic.md): a for_each task's count of instances
    ("3/40 instances"), a skip's reason, a child-run task's child."""
    text = styled(t.get("status"))
    if t.get("item_count") is not None:
        text.append(f" {t.get('instances_succeeded') or 0}/{t['item_count']} instances")
    if t.get("status") == "skipped" and t.get("skip_reason") == "condition_false":
        text.append(" (condition false)")
    if t.get("child_run_id"):
        text.append(f" child {t['child_run_id']}")
    return text


def task_table(tasks: list[dict[str, Any]], workers_by_task: dict[str, str] | None = None) -> Table:
    """One row per task; the instances of a for_each task are counted on its row, not listed (up to 10,000 of
    them: ``awp run task RUN KEY[i]`` shows one)."""
    tasks = [t for t in tasks if t.get("mapped_task") is None]
    table = Table("task", "status", "attempts", "executor", "action", box=None)
    if workers_by_task is not None:
        table.add_column("worker")
    waits = any(t.get("wait_reason") for t in tasks)
    if waits:
        table.add_column("waiting (why)")
    for t in tasks:
        row: list[Any] = [
            str(t.get("task_key")),
            dynamic_status(t),
            str(t.get("attempts", 0)),
            str(t.get("executor") or t.get("executor_kind") or ""),
            str(t.get("action") or ""),
        ]
        if workers_by_task is not None:
            row.append(workers_by_task.get(str(t.get("task_key")), ""))
        if waits:
            row.append(Text(str(t.get("wait_reason") or ""), style="yellow"))
        table.add_row(*row)
    return table


def status_counts(tasks: list[dict[str, Any]]) -> Counter[str]:
    return Counter(str(t.get("status")) for t in tasks)


def counts_text(counts: Counter[str]) -> str:
    parts = []
    for status in (*TASK_STATUSES, *sorted(set(counts) - set(TASK_STATUSES))):
        if counts.get(status):
            style = STATUS_STYLE.get(status, "")
            parts.append(f"[{style}]{status} {counts[status]}[/]" if style else f"{status} {counts[status]}")
    return "  ".join(parts)


async def watch_run(
    client: Client,
    run_id: str,
    console: Console,
    *,
    quiet: bool = False,
    poll_s: float = 0.5,
    on_tick: TickHook | None = None,
    timeout_s: float | None = None,
) -> str:
    """Show a live bar with counts by task status until the run is terminal, then a summary table.

    ``on_tick(run, tasks)`` runs after each poll (the demo uses it to kill a worker); returns the final status.
    """
    start = time.monotonic()
    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(bar_width=40),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[counts]}"),
        console=console,
        transient=False,
        disable=quiet,
    )
    bar = None
    info: dict[str, Any] = {}
    tasks: list[dict[str, Any]] = []
    counts: Counter[str] = Counter()
    with Live(progress, console=console, refresh_per_second=8, transient=False) if not quiet else nullcontext():
        while True:
            info = await client.get_run(run_id)
            # The run's task_counts drive the bar (one request per poll, whatever the run's size); the task list
            # (one request per page of tasks) only when on_tick needs it, and once for the final table.
            counts = Counter({str(k): int(v) for k, v in (info.get("task_counts") or {}).items()})
            if on_tick is not None:
                tasks = await client.run_tasks(run_id)
                counts = status_counts(tasks)
            total = sum(counts.values())
            done = sum(counts[s] for s in TASK_DONE)
            if bar is None:
                bar = progress.add_task(f"{info.get('workflow_id')} {run_id}", total=total or 1, counts="")
            waiting = waiting_text(info)
            progress.update(
                bar,
                completed=done,
                total=total or 1,
                counts=counts_text(counts) + (f"  [yellow]{waiting}[/]" if waiting else ""),
            )
            if on_tick is not None:
                await on_tick(info, tasks)
            if info.get("status") in RUN_TERMINAL and done == total:
                break
            if timeout_s is not None and time.monotonic() - start >= timeout_s:
                break
            delay = poll_s if timeout_s is None else min(poll_s, max(0.0, start + timeout_s - time.monotonic()))
            await asyncio.sleep(delay)
    if not quiet and not console.is_terminal:
        console.print()  # the last frame of the bar does not end its line off a terminal
    if info.get("status") not in RUN_TERMINAL or sum(counts[s] for s in TASK_DONE) != sum(counts.values()):
        raise WatchTimeout(run_id, str(info.get("status")), timeout_s or 0.0)
    if not quiet:
        if on_tick is None:
            tasks = await client.run_tasks(run_id)
        console.print(task_table(tasks))
        console.print(run_header(info))
        counts = status_counts(tasks)
        duration = run_duration_s(info)
        took = f"{duration:.1f}s" if duration is not None else f"{time.monotonic() - start:.1f}s watched"
        console.print(f"{len(tasks)} task{'' if len(tasks) == 1 else 's'}: {counts_text(counts)}; {took}")
    return str(info.get("status"))


class WatchTimeout(TimeoutError):
    """``watch_run`` gave up after ``timeout_s`` while the run was still going (``status``)."""

    def __init__(self, run_id: str, status: str, timeout_s: float) -> None:
        super().__init__(f"run {run_id} still {status} after {timeout_s:.0f}s")
        self.run_id = run_id
        self.status = status
        self.timeout_s = timeout_s


def parse_time(value: Any) -> datetime | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(str(value))
    except ValueError:
        return None


def run_duration_s(info: dict[str, Any]) -> float | None:
    """A finished run's duration by the database's clock: finished_at - started_at (created_at when it never
    started); None while it has not finished."""
    finished = parse_time(info.get("finished_at"))
    began = parse_time(info.get("started_at")) or parse_time(info.get("created_at"))
    if finished is None or began is None:
        return None
    return max(0.0, (finished - began).total_seconds())
