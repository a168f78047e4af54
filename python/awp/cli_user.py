"""The people-facing commands of ``awp``: ``worker``, ``workflow apply``,
``run start|show|task|watch|events|cancel``, ``workers``, ``status``, ``schedule create|list|delete`` and ``demo``.
Everything but ``worker`` talks to the gateway with the operator (or viewer) token, so it works from any
machine: ``--gateway`` / ``AWP_GATEWAY_URL`` and ``--token`` / ``AWP_OPERATOR_TOKEN``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine
from contextlib import nullcontext, suppress
from datetime import datetime
from functools import wraps
from pathlib import Path
from typing import Any, TypeVar

import click
import yaml
from rich.console import Console
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from awp.cli import main
from awp.client import ApiError, Client, ClientError

DEFAULT_GATEWAY = "http://127.0.0.1:8080"
RUN_TERMINAL = frozenset({"succeeded", "failed", "canceled"})
TASK_STATUSES = (
    "succeeded",
    "running",
    "queued",
    "ready",
    "waiting_retry",
    "waiting_dependencies",
    "failed",
    "skipped",
    "canceled",
)
TASK_DONE = frozenset({"succeeded", "failed", "skipped", "canceled"})
EXIT_WAIT_TIMEOUT = 124  # `awp run start --wait --timeout`: still running when the time was up (as timeout(1))
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

T = TypeVar("T")


def _styled(status: str | None) -> Text:
    s = status or "-"
    return Text(s, style=STATUS_STYLE.get(s, ""))


def _run(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine; gateway errors become a one-line click error."""
    try:
        return asyncio.run(coro)
    except ApiError as e:
        raise click.ClickException(f"{e.code}: {e.message}") from e
    except ClientError as e:
        raise click.ClickException(str(e)) from e


def gateway_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """--gateway, --token and --json, passed to the command as a ``Client`` and ``as_json``."""

    @click.option(
        "--gateway",
        envvar="AWP_GATEWAY_URL",
        default=DEFAULT_GATEWAY,
        show_default=True,
        help="Gateway base URL (AWP_GATEWAY_URL).",
    )
    @click.option("--token", envvar="AWP_OPERATOR_TOKEN", default=None, help="Operator token (AWP_OPERATOR_TOKEN).")
    @click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON output.")
    @wraps(func)
    def wrapper(gateway: str, token: str | None, as_json: bool, **kwargs: Any) -> Any:
        return func(client=Client(gateway, token), as_json=as_json, **kwargs)

    return wrapper


def _echo_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=False, default=str))


async def _with(client: Client, call: Callable[[Client], Awaitable[T]]) -> T:
    async with client:
        return await call(client)


# ---- awp worker ----------------------------------------------------------------------------------------------


@main.command()
@click.option("--gateway", envvar="AWP_GATEWAY_URL", default=DEFAULT_GATEWAY, show_default=True, help="Gateway URL.")
@click.option("--bootstrap-token", envvar="AWP_WORKER_BOOTSTRAP_TOKEN", required=True, help="Registration token.")
@click.option(
    "--executor",
    "executor_kinds",
    envvar="AWP_WORKER_EXECUTORS",
    default="mock",
    show_default=True,
    help="Executor kinds, comma-separated (mock, python).",
)
@click.option(
    "--concurrency",
    envvar="AWP_WORKER_CONCURRENCY",
    type=click.IntRange(1, 1000),
    default=4,
    show_default=True,
    help="Leases held at once.",
)
@click.option(
    "--handlers",
    "handler_modules",
    envvar="AWP_WORKER_HANDLERS",
    multiple=True,
    help="Module (or .py file) with @handler functions; repeatable.",
)
@click.option("--name", envvar="AWP_WORKER_NAME", default="", help="Display name [default: host-pid].")
@click.option(
    "--shutdown-timeout",
    envvar="AWP_WORKER_SHUTDOWN_TIMEOUT",
    type=click.FloatRange(0),
    default=30.0,
    show_default=True,
    help="Seconds to finish active leases after SIGTERM/SIGINT.",
)
@click.option(
    "--safety-margin-ms",
    envvar="AWP_WORKER_SAFETY_MARGIN_MS",
    type=click.IntRange(0),
    default=1000,
    show_default=True,
    help="Cancel this long before the lease would end (capped at half the lease).",
)
@click.option(
    "--wait-ms",
    envvar="AWP_WORKER_WAIT_MS",
    type=click.IntRange(0, 30000),
    default=20000,
    show_default=True,
    help="Long-poll time of a claim.",
)
@click.option(
    "--piggyback/--no-piggyback",
    envvar="AWP_WORKER_PIGGYBACK",
    default=True,
    show_default=True,
    help="Ask for the next lease in the same request as each completion.",
)
@click.option(
    "--batch/--no-batch",
    envvar="AWP_WORKER_BATCH",
    default=True,
    show_default=True,
    help="With --concurrency > 1: send the results that are ready together, one request for many.",
)
@click.option(
    "--log-level",
    envvar="AWP_WORKER_LOG_LEVEL",
    type=click.Choice(["debug", "info", "warning", "error"]),
    default="info",
    show_default=True,
    help="Worker log level (info logs every claim and completion).",
)
def worker(
    gateway: str,
    bootstrap_token: str,
    executor_kinds: str,
    concurrency: int,
    handler_modules: tuple[str, ...],
    name: str,
    shutdown_timeout: float,
    safety_margin_ms: int,
    wait_ms: int,
    piggyback: bool,
    batch: bool,
    log_level: str,
) -> None:
    """Run a worker: register, claim tasks, heartbeat, execute, complete; SIGTERM drains."""
    from awp.worker import WorkerConfig, run_worker

    logging.getLogger("awp").setLevel(log_level.upper())

    modules: list[str] = []
    for item in handler_modules:  # the env var may hold several, separated by commas or spaces
        modules.extend(m for m in item.replace(",", " ").split() if m)
    config = WorkerConfig(
        gateway=gateway,
        bootstrap_token=bootstrap_token,
        executors=[k.strip() for k in executor_kinds.split(",") if k.strip()],
        concurrency=concurrency,
        handler_modules=modules,
        name=name,
        shutdown_timeout_s=shutdown_timeout,
        safety_margin_ms=safety_margin_ms,
        wait_ms=wait_ms,
        piggyback=piggyback,
        batch=batch,
    )
    sys.exit(run_worker(config))


# ---- awp workflow --------------------------------------------------------------------------------------------


@main.group()
def workflow() -> None:
    """Workflow definitions."""


def load_definition(path: Path) -> dict[str, Any]:
    text = path.read_text(encoding="utf-8")
    try:
        data = json.loads(text) if path.suffix.lower() == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as e:
        raise click.ClickException(f"{path}: not valid JSON/YAML: {e}") from e
    if not isinstance(data, dict):
        raise click.ClickException(f"{path}: the definition must be an object")
    return data


@workflow.command("apply")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@gateway_options
def workflow_apply(client: Client, as_json: bool, file: Path) -> None:
    """Create a new version of the workflow in FILE (JSON or YAML); an unchanged definition keeps its version."""
    definition = load_definition(file)
    answer = _run(_with(client, lambda c: c.apply_workflow(definition)))
    if as_json:
        _echo_json(answer)
    else:
        click.echo(f"workflow {answer['workflow_id']} version {answer['version']}")


# ---- awp run ---------------------------------------------------------------------------------------------------


@main.group()
def run() -> None:
    """Runs: start, show, task, watch, events, cancel."""


@run.command("start")
@click.argument("workflow_id")
@click.option("--version", type=int, default=None, help="Workflow version [default: latest].")
@click.option("--idempotency-key", default=None, help="Same key, same run [default: a new run].")
@click.option(
    "--input", "input_text", metavar="JSON", default=None, help="The run's input: a JSON object, e.g. '{\"day\": 3}'."
)
@click.option(
    "--input-file",
    type=click.Path(exists=True, dir_okay=False, allow_dash=True, path_type=Path),
    default=None,
    help="Read the run's input (a JSON object) from this file ('-': standard input).",
)
@click.option("--wait", is_flag=True, help="Watch the run until it ends; exit 1 unless it succeeded.")
@click.option(
    "--timeout",
    "timeout_s",
    metavar="SECONDS",
    type=click.FloatRange(0, min_open=True),
    default=None,
    help=f"With --wait: give up watching after SECONDS (the run goes on); exit {EXIT_WAIT_TIMEOUT}.",
)
@gateway_options
def run_start(
    client: Client,
    as_json: bool,
    workflow_id: str,
    version: int | None,
    idempotency_key: str | None,
    input_text: str | None,
    input_file: Path | None,
    wait: bool,
    timeout_s: float | None,
) -> None:
    """Start a run of WORKFLOW_ID, with --input or --input-file as the run's input.

    \b
    Exit codes: 0 started (with --wait: succeeded); 1 an error, or with --wait the run failed or was
    canceled; 2 a usage error; 124 --timeout passed before the run ended (it is still running).
    """
    if timeout_s is not None and not wait:
        raise click.UsageError("--timeout needs --wait")
    run_input = _run_input(input_text, input_file)

    async def go(c: Client) -> tuple[dict[str, Any], str | None]:
        started = await c.start_run(workflow_id, version, idempotency_key, input=run_input)
        if not as_json:
            click.echo(f"run {started['run_id']} {started.get('status', '')}".rstrip())
        final = None
        if wait:
            final = await watch_run(c, started["run_id"], Console(), quiet=as_json, timeout_s=timeout_s)
        return started, final

    try:
        started, final = _run(_with(client, go))
    except WatchTimeout as e:
        if as_json:
            _echo_json({"run_id": e.run_id, "status": e.status, "final_status": None, "timed_out": True})
        else:
            click.echo(
                f"run {e.run_id} is still running after {e.timeout_s:g}s (status {e.status}); "
                f"follow it with: awp run watch {e.run_id}",
                err=True,
            )
        sys.exit(EXIT_WAIT_TIMEOUT)
    if as_json:
        _echo_json({**started, **({"final_status": final} if final else {})})
    if wait and final != "succeeded":
        sys.exit(1)


def _run_input(text: str | None, path: Path | None) -> dict[str, Any] | None:
    """The run input of --input or --input-file: a JSON object (a usage error otherwise), or None."""
    if text is not None and path is not None:
        raise click.UsageError("--input and --input-file are mutually exclusive")
    if path is not None:
        option = "--input-file"
        try:
            text = sys.stdin.read() if str(path) == "-" else path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise click.BadParameter(f"cannot read {path}: {e}", param_hint=option) from e
    elif text is not None:
        option = "--input"
    else:
        return None
    try:
        value = json.loads(text)
    except ValueError as e:
        raise click.BadParameter(f"not valid JSON: {e}", param_hint=option) from e
    if not isinstance(value, dict):
        kind = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(type(value), "a number")
        raise click.BadParameter(f"must be a JSON object, not {kind}", param_hint=option)
    return value


@run.command("show")
@click.argument("run_id")
@gateway_options
def run_show(client: Client, as_json: bool, run_id: str) -> None:
    """A run and its tasks."""

    async def go(c: Client) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
        info, tasks = await c.get_run(run_id), await c.run_tasks(run_id)
        failed = [await c.get_task(run_id, str(t["task_key"])) for t in tasks if t.get("status") == "failed"]
        return info, tasks, failed

    info, tasks, failed = _run(_with(client, go))
    if as_json:
        _echo_json({"run": info, "tasks": tasks})
        return
    console = Console(highlight=False)
    console.print(_run_header(info))
    width = max(20, console.width - 8)
    if info.get("input"):
        console.print(Text("input  " + _preview(info["input"], width)), crop=False, soft_wrap=True)
    if info.get("output") is not None:
        console.print(Text("output " + _preview(info["output"], width)), crop=False, soft_wrap=True)
    console.print(task_table(tasks))
    for line in wait_lines(tasks):  # what holds the waiting tasks, one line per reason (docs/limits.md)
        console.print(line, crop=False, soft_wrap=True)
    for t in failed:
        last = (t.get("attempt_history") or [{}])[-1]
        line = Text(f"{t.get('task_key')} failed: ", style="red")
        line.append(f"attempt {last.get('attempt')} {last.get('status')}, {last.get('error_code') or '-'}")
        if last.get("error_message"):
            line.append(f": {last.get('error_message')}")
        console.print(line)


@run.command("task")
@click.argument("run_id")
@click.argument("task_key")
@gateway_options
def run_task(client: Client, as_json: bool, run_id: str, task_key: str) -> None:
    """One task of a run and its attempts: status, worker, times, error, output."""

    async def go(c: Client) -> tuple[dict[str, Any], dict[str, str]]:
        task = await c.get_task(run_id, task_key)
        names: dict[str, str] = {}
        if not as_json:
            for worker_id in {str(a["worker_id"]) for a in task.get("attempt_history") or [] if a.get("worker_id")}:
                with suppress(ClientError):  # the worker's name is a nicety: show its id alone otherwise
                    names[worker_id] = str((await c.get_worker(worker_id)).get("display_name") or "")
        return task, names

    task, names = _run(_with(client, go))
    if as_json:
        _echo_json(task)
        return
    console = Console(highlight=False)
    for line in task_lines(run_id, task, names, console.width):
        console.print(line, crop=False, soft_wrap=True)


def task_lines(run_id: str, task: dict[str, Any], worker_names: dict[str, str], width: int = 100) -> list[Text]:
    """The lines of ``awp run task``: the task, then each attempt with its error and an output preview."""
    head = Text(f"task {task.get('task_key')}  ", style="bold")
    head.append_text(_styled(task.get("status")))
    head.append(f"  run {run_id}  attempts {task.get('attempts', 0)}/{task.get('max_attempts', '?')}")
    lines = [head]
    action = f"  action {task['action']}" if task.get("action") else ""
    timeout = f"  timeout {task['timeout_ms']} ms" if task.get("timeout_ms") else ""
    lines.append(Text(f"executor {task.get('executor') or '-'}{action}{timeout}"))
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
        line.append_text(_styled(a.get("status")))
        worker_id = a.get("worker_id")
        if worker_id:
            name = worker_names.get(str(worker_id))
            line.append(f"  on {name} ({worker_id})" if name else f"  on {worker_id}")
        started, finished = _parse_time(a.get("started_at")), _parse_time(a.get("finished_at"))
        line.append(f"  started {_short_time(a.get('started_at'))}")
        if finished is not None:
            line.append(f"  finished {_short_time(a.get('finished_at'))}")
            if started is not None:
                line.append(f"  took {max(0.0, (finished - started).total_seconds()):.2f}s")
        elif a.get("deadline"):
            line.append(f"  deadline {_short_time(a.get('deadline'))}")
        lines.append(line)
        if a.get("error_code") or a.get("error_message"):
            error = Text("    error ", style="red")
            error.append(str(a.get("error_code") or "-"))
            if a.get("error_message"):
                error.append(f": {a.get('error_message')}")
            lines.append(error)
        if a.get("output") is not None or a.get("status") == "succeeded":
            prefix = "    output "
            lines.append(Text(prefix + _preview(a.get("output"), max(20, width - len(prefix)))))
    return lines


def _preview(value: Any, limit: int) -> str:
    """Compact JSON of ``value``, cut to ``limit`` characters (ending with …)."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


@run.command("watch")
@click.argument("run_id")
@gateway_options
def run_watch(client: Client, as_json: bool, run_id: str) -> None:
    """Live progress of a run until it ends, then a summary; exit 1 unless it succeeded."""
    final = _run(_with(client, lambda c: watch_run(c, run_id, Console(), quiet=as_json)))
    if as_json:
        _echo_json({"run_id": run_id, "status": final})
    if final != "succeeded":
        sys.exit(1)


@run.command("events")
@click.argument("run_id")
@click.option("--after", "after_sequence", type=int, default=0, help="Only events after this sequence.")
@gateway_options
def run_events(client: Client, as_json: bool, run_id: str, after_sequence: int) -> None:
    """The run's state changes, in order."""
    events = _run(_with(client, lambda c: c.run_events(run_id, after_sequence)))
    if as_json:
        _echo_json(events)
        return
    console = Console(highlight=False)
    for e in events:
        line = Text(f"{e.get('sequence'):>5}  {_short_time(e.get('occurred_at'))}  r{e.get('revision')}  ")
        line.append(f"{e.get('entity_type')} {e.get('entity_key')}  ", style="bold")
        line.append_text(_styled(e.get("from_status")))
        line.append(" → ")
        line.append_text(_styled(e.get("to_status")))
        if e.get("reason"):
            line.append(f"  ({e.get('reason')})", style="dim")
        console.print(line, crop=False, soft_wrap=True)


@run.command("cancel")
@click.argument("run_id")
@gateway_options
def run_cancel(client: Client, as_json: bool, run_id: str) -> None:
    """Request cancellation of a run (durable; it converges shortly)."""
    answer = _run(_with(client, lambda c: c.cancel_run(run_id)))
    if as_json:
        _echo_json(answer)
    else:
        click.echo(cancel_message(answer))


def cancel_message(answer: dict[str, Any]) -> str:
    """What a cancel request did, from its answer (a finished run is returned unchanged)."""
    run_id, status, requested = answer.get("run_id"), answer.get("status"), answer.get("cancel_requested_at")
    if status == "canceled":
        return f"run {run_id} canceled" + (f" (cancel requested at {requested})" if requested else "")
    if status in RUN_TERMINAL or not requested:
        return f"run {run_id} already {status}; nothing to cancel"
    return f"run {run_id} {status}; cancel requested at {requested} (it converges shortly)"


# ---- awp status ----------------------------------------------------------------------------------------------


@main.command("status")
@gateway_options
def status_cmd(client: Client, as_json: bool) -> None:
    """One screen of the cluster: workers and slots by executor kind, dispatches in flight against the limits,
    the oldest waiting task and why (docs/limits.md)."""
    answer = _run(_with(client, lambda c: c.cluster_status()))
    if as_json:
        _echo_json(answer)
        return
    console = Console(highlight=False)
    for line in status_lines(answer):
        console.print(line, crop=False, soft_wrap=True)


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
        since = _parse_time(oldest.get("since"))
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
    tick = _parse_time(s.get("last_tick_at"))
    if tick is None:
        out.append(Text("no coordinator pass yet: is `awp serve` running?", style="red"))
    else:
        ago = max(0.0, (datetime.now(tick.tzinfo) - tick).total_seconds())
        out.append(Text(f"last coordinator pass {ago:.1f}s ago", style="red" if ago > 10 else "dim"))
    return out


# ---- awp workers ---------------------------------------------------------------------------------------------


@main.command("workers")
@gateway_options
def workers_cmd(client: Client, as_json: bool) -> None:
    """The registered workers."""
    items = _run(_with(client, lambda c: c.list_workers()))
    if as_json:
        _echo_json(items)
        return
    Console().print(workers_table(items))


def workers_table(items: list[dict[str, Any]]) -> Table:
    table = Table("worker", "name", "status", "executors", "leases", "last heartbeat", box=None)
    for w in items:
        table.add_row(
            str(w.get("worker_id")),
            str(w.get("display_name")),
            _styled(w.get("status")),
            ",".join(w.get("executor_kinds") or []),
            f"{w.get('active_leases', 0)}/{w.get('max_concurrency', '?')}",
            _short_time(w.get("last_heartbeat_at")),
        )
    return table


# ---- awp schedule --------------------------------------------------------------------------------------------


@main.group()
def schedule() -> None:
    """Schedules: start runs of a workflow on a cron expression or every N ms (docs/schedules.md)."""


@schedule.command("create")
@click.argument("schedule_id")
@click.argument("workflow_id")
@click.option(
    "--cron",
    metavar="EXPR",
    default=None,
    help="Cron expression: 5 fields (minute hour day-of-month month day-of-week) or 6 (seconds first).",
)
@click.option(
    "--every-ms",
    "every_ms",
    metavar="N",
    type=click.IntRange(1000, 2**31 - 1),
    default=None,
    help="Fire every N milliseconds (at least 1000), counted from the schedule's creation.",
)
@click.option("--input", "input_text", metavar="JSON", default=None, help="The input of every run: a JSON object.")
@click.option(
    "--input-file",
    type=click.Path(exists=True, dir_okay=False, allow_dash=True, path_type=Path),
    default=None,
    help="Read the runs' input (a JSON object) from this file ('-': standard input).",
)
@click.option("--timezone", default=None, help="Time zone of the cron expression, e.g. Europe/Berlin [default: UTC].")
@gateway_options
def schedule_create(
    client: Client,
    as_json: bool,
    schedule_id: str,
    workflow_id: str,
    cron: str | None,
    every_ms: int | None,
    input_text: str | None,
    input_file: Path | None,
    timezone: str | None,
) -> None:
    """Create SCHEDULE_ID: start a run of WORKFLOW_ID (its latest version) at every fire time of --cron EXPR or
    every --every-ms N. The same definition again is a no-op; another one is refused (delete it first)."""
    if (cron is None) == (every_ms is None):
        raise click.UsageError("give exactly one of --cron and --every-ms")
    schedule_input = _run_input(input_text, input_file)
    answer = _run(
        _with(
            client,
            lambda c: c.create_schedule(
                schedule_id, workflow_id, cron=cron, interval_ms=every_ms, input=schedule_input, timezone=timezone
            ),
        )
    )
    if as_json:
        _echo_json(answer)
    else:
        click.echo(
            f"schedule {answer['schedule_id']}: workflow {answer['workflow_id']} {_schedule_trigger(answer)}; "
            f"next fire at {answer.get('next_fire_at')}"
        )


@schedule.command("list")
@gateway_options
def schedule_list(client: Client, as_json: bool) -> None:
    """Every schedule with its next and last fire times."""
    items = _run(_with(client, lambda c: c.list_schedules()))
    if as_json:
        _echo_json(items)
        return
    # Plain aligned columns, never wrapped or cut (rich tables squeeze long cron expressions on narrow terminals).
    rows = [("schedule", "workflow", "when", "next fire", "last fired", "last run")]
    for s in items:
        rows.append(
            (
                str(s.get("schedule_id")),
                str(s.get("workflow_id")),
                _schedule_trigger(s),
                str(s.get("next_fire_at") or "-"),
                str(s.get("last_fired_at") or "-"),
                str(s.get("last_run_id") or "-"),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        click.echo("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())


@schedule.command("delete")
@click.argument("schedule_id")
@gateway_options
def schedule_delete(client: Client, as_json: bool, schedule_id: str) -> None:
    """Delete SCHEDULE_ID (runs it started are kept)."""
    answer = _run(_with(client, lambda c: c.delete_schedule(schedule_id)))
    if as_json:
        _echo_json(answer)
    else:
        click.echo(f"schedule {answer.get('schedule_id', schedule_id)} deleted")


def _schedule_trigger(s: dict[str, Any]) -> str:
    if s.get("cron"):
        return f"cron '{s['cron']}' ({s.get('timezone') or 'UTC'})"
    return f"every {s.get('interval_ms')} ms"


# ---- rendering and watching ----------------------------------------------------------------------------------


def _short_time(value: Any) -> str:
    if not value:
        return "-"
    text = str(value)
    return text[11:23] if len(text) >= 19 and text[10] in "T " else text


def _run_header(info: dict[str, Any]) -> Text:
    text = Text()
    text.append(f"run {info.get('run_id')}  ", style="bold")
    text.append(f"{info.get('workflow_id')} v{info.get('workflow_version')}  ")
    text.append_text(_styled(info.get("status")))
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
    "run_concurrency": "run concurrency reached",
    "dispatch_limit": "global dispatch_limit reached",
    "workers_full": "every worker of the kind is full",
    "fairness": "queued behind other runs",
    "waiting_for_dispatch": "about to be dispatched",
    "waiting_for_claim": "dispatched, waiting for a claim",
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


def task_table(tasks: list[dict[str, Any]], workers_by_task: dict[str, str] | None = None) -> Table:
    table = Table("task", "status", "attempts", "executor", "action", box=None)
    if workers_by_task is not None:
        table.add_column("worker")
    waits = any(t.get("wait_reason") for t in tasks)
    if waits:
        table.add_column("waiting (why)")
    for t in tasks:
        row: list[Any] = [
            str(t.get("task_key")),
            _styled(t.get("status")),
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


def _counts_text(counts: Counter[str]) -> str:
    parts = []
    for status in (*TASK_STATUSES, *sorted(set(counts) - set(TASK_STATUSES))):
        if counts.get(status):
            style = STATUS_STYLE.get(status, "")
            parts.append(f"[{style}]{status} {counts[status]}[/]" if style else f"{status} {counts[status]}")
    return "  ".join(parts)


TickHook = Callable[[dict[str, Any], list[dict[str, Any]]], Awaitable[None]]


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
                counts=_counts_text(counts) + (f"  [yellow]{waiting}[/]" if waiting else ""),
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
        console.print(_run_header(info))
        counts = status_counts(tasks)
        duration = run_duration_s(info)
        took = f"{duration:.1f}s" if duration is not None else f"{time.monotonic() - start:.1f}s watched"
        console.print(f"{len(tasks)} tasks: {_counts_text(counts)}; {took}")
    return str(info.get("status"))


class WatchTimeout(TimeoutError):
    """``watch_run`` gave up after ``timeout_s`` while the run was still going (``status``)."""

    def __init__(self, run_id: str, status: str, timeout_s: float) -> None:
        super().__init__(f"run {run_id} still {status} after {timeout_s:.0f}s")
        self.run_id = run_id
        self.status = status
        self.timeout_s = timeout_s


def _parse_time(value: Any) -> datetime | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(str(value))
    except ValueError:
        return None


def run_duration_s(info: dict[str, Any]) -> float | None:
    """A finished run's duration by the database's clock: finished_at - started_at (created_at when it never
    started); None while it has not finished."""
    finished = _parse_time(info.get("finished_at"))
    began = _parse_time(info.get("started_at")) or _parse_time(info.get("created_at"))
    if finished is None or began is None:
        return None
    return max(0.0, (finished - began).total_seconds())


# ---- awp demo --------------------------------------------------------------------------------------------------


@main.command()
@click.option(
    "--database-url",
    envvar="AWP_DATABASE_URL",
    default=None,
    help="Use this (superuser) database instead of the local cluster under .awp/.",
)
@click.option("--fast", is_flag=True, help="Shorter tasks and timings (for tests).")
@click.option("--port", type=int, default=0, help="Gateway port [default: a free one].")
@click.option("--workers", "n_workers", type=click.IntRange(2, 16), default=3, show_default=True)
def demo(database_url: str | None, fast: bool, port: int, n_workers: int) -> None:
    """Start the database, the gateway and workers; run the example DAG; kill a worker mid-run; show the takeover."""
    from awp.demo import DemoError, run_demo

    try:
        code = run_demo(database_url=database_url, fast=fast, port=port, n_workers=n_workers)
    except DemoError as e:
        raise click.ClickException(str(e)) from e
    sys.exit(code)
