"""``awp run start|list|show|task|watch|events|logs|signal|retry|cancel``: the runs of workflows, through the
gateway."""

from __future__ import annotations

import asyncio
import json
import sys
from contextlib import suppress
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.text import Text

from awp.cli.terminal import (
    WatchTimeout,
    cancel_message,
    preview,
    run_header,
    short_time,
    styled,
    task_lines,
    task_table,
    wait_lines,
    watch_run,
)
from awp.cli.user import echo_columns, echo_json, gateway_options, input_object, report_console, run_call, with_client
from awp.protocol.statuses import TASK_DONE
from awp.worker.client import Client, ClientError

EXIT_WAIT_TIMEOUT = 124  # `awp run start --wait --timeout`: still running when the time was up (as timeout(1))
FOLLOW_INTERVAL_S = 0.3  # awp run logs --follow asks for news this often
SHOW_PROGRESS = 20  # awp run show: the latest progress of at most this many running tasks


@click.group()
def run() -> None:
    """Runs: start, list, show, task, watch, events, signal, retry, cancel."""


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
@click.option(
    "--priority",
    type=click.IntRange(0, 9),
    default=None,
    help="0-9, replaces every task's own priority (higher first when capacity is short) [default: the tasks'].",
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
    priority: int | None,
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
    run_input = input_object(input_text, input_file)

    async def go(c: Client) -> tuple[dict[str, Any], str | None]:
        started = await c.start_run(workflow_id, version, idempotency_key, input=run_input, priority=priority)
        if not as_json:
            click.echo(f"run {started['run_id']} {started.get('status', '')}".rstrip())
        final = None
        if wait:
            final = await watch_run(c, started["run_id"], Console(), quiet=as_json, timeout_s=timeout_s)
        return started, final

    try:
        started, final = run_call(with_client(client, go))
    except WatchTimeout as e:
        if as_json:
            echo_json({"run_id": e.run_id, "status": e.status, "final_status": None, "timed_out": True})
        else:
            click.echo(
                f"run {e.run_id} is still running after {e.timeout_s:g}s (status {e.status}); "
                f"follow it with: awp run watch {e.run_id}",
                err=True,
            )
        sys.exit(EXIT_WAIT_TIMEOUT)
    if as_json:
        echo_json({**started, **({"final_status": final} if final else {})})
    if wait and final != "succeeded":
        sys.exit(1)


@run.command("list")
@click.option("--workflow", "workflow_id", default=None, help="Only runs of this workflow.")
@click.option("--status", type=click.Choice(["pending", "running", "succeeded", "failed", "canceled"]), default=None)
@click.option("--limit", type=click.IntRange(1, 10000), default=50, show_default=True, help="At most this many.")
@gateway_options
def run_list(client: Client, as_json: bool, workflow_id: str | None, status: str | None, limit: int) -> None:
    """Runs, newest first."""
    items = run_call(with_client(client, lambda c: c.list_runs(workflow_id, status, limit)))
    if as_json:
        echo_json(items)
        return
    if not items:
        click.echo(
            "no runs" + (f" of workflow {workflow_id}" if workflow_id else "") + (f" {status}" if status else "")
        )
        return
    rows = [("run", "workflow", "status", "created", "finished", "tasks")]
    for r in items:
        counts = r.get("task_counts") or {}
        rows.append(
            (
                str(r.get("run_id")),
                f"{r.get('workflow_id')} v{r.get('workflow_version')}",
                str(r.get("status")),
                str(r.get("created_at")),
                str(r.get("finished_at") or "-"),
                ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "-",
            )
        )
    echo_columns(rows)


@run.command("show")
@click.argument("run_id")
@gateway_options
def run_show(client: Client, as_json: bool, run_id: str) -> None:
    """A run and its tasks."""

    async def go(c: Client) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
        info, tasks = await c.get_run(run_id), await c.run_tasks(run_id)
        failed = [await c.get_task(run_id, str(t["task_key"])) for t in tasks if t.get("status") == "failed"]
        # The latest progress of the running tasks (docs/progress.md), of the first SHOW_PROGRESS of them.
        running = [str(t["task_key"]) for t in tasks if t.get("status") == "running"][:SHOW_PROGRESS]
        progress = {key: p for key in running if (p := (await c.get_task(run_id, key)).get("progress")) is not None}
        return info, tasks, failed, progress

    info, tasks, failed, progress = run_call(with_client(client, go))
    if as_json:
        echo_json({"run": info, "tasks": tasks, "progress": progress})
        return
    console = report_console()
    console.print(run_header(info))
    width = max(20, console.width - 8)
    if info.get("parent_run_id"):  # a child run (docs/dynamic.md)
        console.print(Text(f"parent {info['parent_run_id']} (task {info.get('parent_task_key')})"), crop=False)
    if info.get("input"):
        console.print(Text("input  " + preview(info["input"], width)), crop=False, soft_wrap=True)
    if info.get("output") is not None:
        console.print(Text("output " + preview(info["output"], width)), crop=False, soft_wrap=True)
    console.print(task_table(tasks))
    for line in wait_lines(tasks):  # what holds the waiting tasks, one line per reason (docs/limits.md)
        console.print(line, crop=False, soft_wrap=True)
    for key, value in progress.items():
        console.print(Text(f"progress {key}: " + preview(value, width)), crop=False, soft_wrap=True)
    for t in failed:
        line = Text(f"{t.get('task_key')} failed: ", style="red")
        if t.get("error_code"):  # settled by the database (docs/dynamic.md): a for_each, a child run
            line.append(f"{t.get('error_code')}: {t.get('error_message') or '-'}")
        else:
            last = (t.get("attempt_history") or [{}])[-1]
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

    task, names = run_call(with_client(client, go))
    if as_json:
        echo_json(task)
        return
    console = report_console()
    for line in task_lines(run_id, task, names, console.width):
        console.print(line, crop=False, soft_wrap=True)


@run.command("watch")
@click.argument("run_id")
@gateway_options
def run_watch(client: Client, as_json: bool, run_id: str) -> None:
    """Live progress of a run until it ends, then a summary; exit 1 unless it succeeded."""
    final = run_call(with_client(client, lambda c: watch_run(c, run_id, Console(), quiet=as_json)))
    if as_json:
        echo_json({"run_id": run_id, "status": final})
    if final != "succeeded":
        sys.exit(1)


@run.command("events")
@click.argument("run_id")
@click.option("--after", "after_sequence", type=int, default=0, help="Only events after this sequence.")
@gateway_options
def run_events(client: Client, as_json: bool, run_id: str, after_sequence: int) -> None:
    """The run's state changes, in order."""
    events = run_call(with_client(client, lambda c: c.run_events(run_id, after_sequence)))
    if as_json:
        echo_json(events)
        return
    console = report_console()
    for e in events:
        line = Text(f"{e.get('sequence'):>5}  {short_time(e.get('occurred_at'))}  r{e.get('revision')}  ")
        line.append(f"{e.get('entity_type')} {e.get('entity_key')}  ", style="bold")
        line.append_text(styled(e.get("from_status")))
        line.append(" → ")
        line.append_text(styled(e.get("to_status")))
        if e.get("reason"):
            line.append(f"  ({e.get('reason')})", style="dim")
        console.print(line, crop=False, soft_wrap=True)


@run.command("logs")
@click.argument("run_id")
@click.argument("task_key")
@click.option("--follow", "-f", is_flag=True, help="Keep printing new lines until the task ends.")
@click.option("--attempt", type=click.IntRange(1), default=None, help="An attempt [default: the latest].")
@click.option("--after", type=click.IntRange(0), default=0, help="Only what came after this sequence number.")
@gateway_options
def run_logs(
    client: Client, as_json: bool, run_id: str, task_key: str, follow: bool, attempt: int | None, after: int
) -> None:
    """A task's log lines and output chunks (docs/progress.md); with --follow, live until the task ends."""
    run_call(with_client(client, lambda c: follow_logs(c, run_id, task_key, attempt, after, follow, as_json)))


async def follow_logs(
    c: Client, run_id: str, task_key: str, attempt: int | None, after: int, follow: bool, as_json: bool
) -> None:
    """Print log lines (one per line), chunks (as they come, no newline added) and progress changes (to stderr;
    in --json, every item as one JSON line); follow the latest attempt until the task is done."""
    shown_attempt: int | None = None
    progress: Any = None
    open_chunk = False
    while True:
        page = await c.task_logs(run_id, task_key, after=after, attempt=attempt)
        if page.get("attempt") != shown_attempt:
            if shown_attempt is not None:  # a retry: its output starts from the beginning
                after, open_chunk = 0, _end_chunk(open_chunk)
                page = await c.task_logs(run_id, task_key, after=0, attempt=page.get("attempt"))
                click.echo(f"--- attempt {page.get('attempt')} ---", err=True)
            shown_attempt = page.get("attempt")
            if page.get("truncated") and after == 0:
                click.echo(
                    f"[{page.get('logs_dropped')} earlier lines and {page.get('chunks_dropped')} chunks dropped]",
                    err=True,
                )
        for item in page.get("items") or []:
            if as_json:
                click.echo(json.dumps(item, default=str))
            elif item.get("kind") == "chunk":
                sys.stdout.write(str(item.get("text")))
                sys.stdout.flush()
                open_chunk = True
            else:
                open_chunk = _end_chunk(open_chunk)
                click.echo(str(item.get("text")))
        after = int(page.get("next_after") or after)
        if page.get("progress") is not None and page.get("progress") != progress:
            progress = page.get("progress")
            if follow and not as_json:
                click.echo(f"[progress] {json.dumps(progress)}", err=True)
        if page.get("more"):
            continue
        if not follow or page.get("task_status") in TASK_DONE:
            _end_chunk(open_chunk)
            return
        await asyncio.sleep(FOLLOW_INTERVAL_S)


def _end_chunk(open_chunk: bool) -> bool:
    """End the line of the chunks printed so far (a log line or the end follows); always False."""
    if open_chunk:
        sys.stdout.write("\n")
        sys.stdout.flush()
    return False


@run.command("signal")
@click.argument("run_id")
@click.argument("task_key")
@click.option("--payload", "payload_text", default="{}", show_default=True, help="The signal's payload: a JSON object.")
@click.option("--idempotency-key", default=None, help="A repeat with this key and the same payload answers the same.")
@gateway_options
def run_signal(
    client: Client, as_json: bool, run_id: str, task_key: str, payload_text: str, idempotency_key: str | None
) -> None:
    """Send the signal TASK_KEY of RUN_ID waits for (a task of executor signal, e.g. an approval; docs/waits.md)."""
    payload = input_object(payload_text, None, option="--payload")
    answer = run_call(with_client(client, lambda c: c.send_signal(run_id, task_key, payload or {}, idempotency_key)))
    if as_json:
        echo_json(answer)
    else:
        click.echo(
            f"signal to {task_key} of run {run_id} received (attempt {answer.get('attempt')}); "
            f"the task is {answer.get('status')}"
        )


@run.command("retry")
@click.argument("run_id")
@click.option("--task", "task_keys", multiple=True, help="Re-run this task and what depends on it (repeatable).")
@gateway_options
def run_retry(client: Client, as_json: bool, run_id: str, task_keys: tuple[str, ...]) -> None:
    """Re-run a failed or canceled RUN_ID: its failed, canceled and skipped tasks (or --task KEY and what depends on
    it) run again with fresh attempts; the tasks that succeeded keep their outputs."""
    answer = run_call(with_client(client, lambda c: c.retry_run(run_id, list(task_keys) or None)))
    if as_json:
        echo_json(answer)
    else:
        keys = answer.get("task_keys") or []
        click.echo(f"run {run_id} is {answer.get('status')} again: {len(keys)} task(s) to run ({', '.join(keys)})")


@run.command("cancel")
@click.argument("run_id")
@gateway_options
def run_cancel(client: Client, as_json: bool, run_id: str) -> None:
    """Request cancellation of a run (durable; it converges shortly)."""
    answer = run_call(with_client(client, lambda c: c.cancel_run(run_id)))
    if as_json:
        echo_json(answer)
    else:
        click.echo(cancel_message(answer))
