"""The people-facing commands of ``awp``: ``worker``, ``workflow apply``, ``run start|show|watch|events|cancel``,
``workers`` and ``demo``. Everything but ``worker`` talks to the gateway with the operator (or viewer) token,
so it works from any machine: ``--gateway`` / ``AWP_GATEWAY_URL`` and ``--token`` / ``AWP_OPERATOR_TOKEN``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine
from contextlib import nullcontext
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
    """Runs: start, show, watch, events, cancel."""


@run.command("start")
@click.argument("workflow_id")
@click.option("--version", type=int, default=None, help="Workflow version [default: latest].")
@click.option("--idempotency-key", default=None, help="Same key, same run [default: a new run].")
@click.option("--wait", is_flag=True, help="Watch the run until it ends; exit 1 unless it succeeded.")
@gateway_options
def run_start(
    client: Client, as_json: bool, workflow_id: str, version: int | None, idempotency_key: str | None, wait: bool
) -> None:
    """Start a run of WORKFLOW_ID."""

    async def go(c: Client) -> tuple[dict[str, Any], str | None]:
        started = await c.start_run(workflow_id, version, idempotency_key)
        if not as_json:
            click.echo(f"run {started['run_id']} {started.get('status', '')}".rstrip())
        final = None
        if wait:
            final = await watch_run(c, started["run_id"], Console(), quiet=as_json)
        return started, final

    started, final = _run(_with(client, go))
    if as_json:
        _echo_json({**started, **({"final_status": final} if final else {})})
    if wait and final != "succeeded":
        sys.exit(1)


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
    console = Console()
    console.print(_run_header(info))
    console.print(task_table(tasks))
    for t in failed:
        last = (t.get("attempt_history") or [{}])[-1]
        line = Text(f"{t.get('task_key')} failed: ", style="red")
        line.append(f"attempt {last.get('attempt')} {last.get('status')}, {last.get('error_code') or '-'}")
        if last.get("error_message"):
            line.append(f": {last.get('error_message')}")
        console.print(line)


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
        click.echo(
            f"run {answer['run_id']} {answer.get('status')}; cancel requested at {answer.get('cancel_requested_at')}"
        )


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
    return text


def task_table(tasks: list[dict[str, Any]], workers_by_task: dict[str, str] | None = None) -> Table:
    table = Table("task", "status", "attempts", "executor", "action", box=None)
    if workers_by_task is not None:
        table.add_column("worker")
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
    with Live(progress, console=console, refresh_per_second=8, transient=False) if not quiet else nullcontext():
        while True:
            info = await client.get_run(run_id)
            tasks = await client.run_tasks(run_id)
            counts = status_counts(tasks)
            done = sum(counts[s] for s in TASK_DONE)
            if bar is None:
                bar = progress.add_task(f"{info.get('workflow_id')} {run_id}", total=len(tasks) or 1, counts="")
            progress.update(bar, completed=done, total=len(tasks) or 1, counts=_counts_text(counts))
            if on_tick is not None:
                await on_tick(info, tasks)
            if info.get("status") in RUN_TERMINAL and all(t.get("status") in TASK_DONE for t in tasks):
                break
            if timeout_s is not None and time.monotonic() - start > timeout_s:
                raise TimeoutError(f"run {run_id} still {info.get('status')} after {timeout_s:.0f}s")
            await asyncio.sleep(poll_s)
    if not quiet:
        if not console.is_terminal:
            console.print()  # the last frame of the bar does not end its line off a terminal
        console.print(task_table(tasks))
        console.print(_run_header(info))
        counts = status_counts(tasks)
        console.print(f"{len(tasks)} tasks: {_counts_text(counts)}; {time.monotonic() - start:.1f}s")
    return str(info.get("status"))


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
