"""The people-facing commands of ``awp``: ``worker``, ``workflow apply``,
``run start|show|task|watch|events|cancel``, ``workers``, ``status``, ``schedule create|list|delete`` and ``demo``.
Everything but ``worker`` talks to the gateway with the operator (or viewer) token, so it works from any
machine: ``--gateway`` / ``AWP_GATEWAY_URL`` and ``--token`` / ``AWP_OPERATOR_TOKEN``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from contextlib import suppress
from functools import wraps
from pathlib import Path
from typing import Any, TypeVar

import click
import yaml
from rich.console import Console
from rich.text import Text

from awp import eventloop
from awp.cli.terminal import (
    WatchTimeout,
    cancel_message,
    preview,
    run_header,
    schedule_trigger,
    short_time,
    status_lines,
    styled,
    task_lines,
    task_table,
    wait_lines,
    watch_run,
    workers_table,
)
from awp.protocol.statuses import TASK_DONE
from awp.worker.client import Client, ClientError, GatewayError, TlsVerifyError, TransportError

DEFAULT_GATEWAY = "http://127.0.0.1:8080"
EXIT_WAIT_TIMEOUT = 124  # `awp run start --wait --timeout`: still running when the time was up (as timeout(1))

T = TypeVar("T")
FOLLOW_INTERVAL_S = 0.3  # awp run logs --follow asks for news this often
SHOW_PROGRESS = 20  # awp run show: the latest progress of at most this many running tasks


# What to do about an error, by the gateway's error code: each CLI error names its fix (AWP issue 41).
FIXES = {
    "unauthorized": "set AWP_OPERATOR_TOKEN (or --token) to the operator token `awp serve` was given",
    "forbidden": "this needs the operator token: set AWP_OPERATOR_TOKEN (or --token), not the viewer's",
    "unavailable": "the gateway cannot reach its database: start it with `awp db up` (or check awp serve's "
    "AWP_DATABASE_URL), then try again",
}


def _run(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine; gateway errors become a one-line click error that says what to do when it can."""
    try:
        return eventloop.run(coro)
    except GatewayError as e:
        fix = FIXES.get(e.code)
        raise click.ClickException(f"{e.code}: {e.message}" + (f" ({fix})" if fix else "")) from e
    except TlsVerifyError as e:
        raise click.ClickException(str(e)) from e
    except TransportError as e:
        raise click.ClickException(
            f"{e} (is the gateway running? start it with `awp serve`, or point AWP_GATEWAY_URL / --gateway at it)"
        ) from e
    except ClientError as e:
        raise click.ClickException(str(e)) from e


def ca_file_option(func: Callable[..., Any]) -> Callable[..., Any]:
    """--ca-file: the PEM CA certificate(s) an https:// gateway's certificate must chain to."""
    return click.option(
        "--ca-file",
        envvar="AWP_CA_FILE",
        type=click.Path(exists=True, dir_okay=False),
        default=None,
        help="CA certificate (PEM) of an https:// gateway (AWP_CA_FILE) [default: the system's trust store].",
    )(func)


def make_client(gateway: str, token: str | None = None, ca_file: str | None = None) -> Client:
    """A ``Client``; a --ca-file that is no PEM certificate is a usage error."""
    try:
        return Client(gateway, token, ca_file=ca_file)
    except OSError as e:  # ssl.SSLError is an OSError
        raise click.BadParameter(f"{ca_file}: {e}", param_hint="--ca-file") from e


def gateway_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """--gateway, --token, --ca-file and --json, passed to the command as a ``Client`` and ``as_json``."""

    @click.option(
        "--gateway",
        envvar="AWP_GATEWAY_URL",
        default=DEFAULT_GATEWAY,
        show_default=True,
        help="Gateway base URL (AWP_GATEWAY_URL).",
    )
    @click.option("--token", envvar="AWP_OPERATOR_TOKEN", default=None, help="Operator token (AWP_OPERATOR_TOKEN).")
    @click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON output.")
    @ca_file_option
    @wraps(func)
    def wrapper(gateway: str, token: str | None, as_json: bool, ca_file: str | None, **kwargs: Any) -> Any:
        return func(client=make_client(gateway, token, ca_file), as_json=as_json, **kwargs)

    return wrapper


def _console() -> Console:
    """A console for a command's report: when stdout is not a terminal (a pipe, a file) and COLUMNS does not say a
    width, tables are as wide as their content instead of cut to rich's default 80 columns (AWP issue 41)."""
    if sys.stdout.isatty() or os.environ.get("COLUMNS"):
        return Console(highlight=False)
    return Console(highlight=False, width=1000)


def _echo_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=False, default=str))


async def _with(client: Client, call: Callable[[Client], Awaitable[T]]) -> T:
    async with client:
        return await call(client)


# ---- awp worker ----------------------------------------------------------------------------------------------


@click.group(invoke_without_command=True)
@click.option("--gateway", envvar="AWP_GATEWAY_URL", default=DEFAULT_GATEWAY, show_default=True, help="Gateway URL.")
@ca_file_option
@click.option(
    "--bootstrap-token", envvar="AWP_WORKER_BOOTSTRAP_TOKEN", default=None, help="Registration token (required)."
)
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
    "--claim-on-complete/--no-claim-on-complete",
    envvar="AWP_WORKER_CLAIM_ON_COMPLETE",
    default=True,
    show_default=True,
    help="Claim on complete: ask for the next lease in the same request as each completion.",
)
@click.option(  # the flag's name before "claim on complete" became the one word for the idea; still accepted
    "--piggyback/--no-piggyback", "piggyback", envvar="AWP_WORKER_PIGGYBACK", default=None, hidden=True
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
@click.pass_context
def worker(
    ctx: click.Context,
    gateway: str,
    ca_file: str | None,
    bootstrap_token: str | None,
    executor_kinds: str,
    concurrency: int,
    handler_modules: tuple[str, ...],
    name: str,
    shutdown_timeout: float,
    safety_margin_ms: int,
    wait_ms: int,
    claim_on_complete: bool,
    piggyback: bool | None,
    batch: bool,
    log_level: str,
) -> None:
    """Run a worker: register, claim tasks, heartbeat, execute, complete; SIGTERM drains. (`awp worker list`: the
    registered workers; `awp worker drain WORKER_ID`: drain one.)

    \b
    Exit codes: 0 drained; 2 bad options or a rejected bootstrap token; 3 the session became invalid (restart:
    it registers anew); 4 the drain ended with hung handlers still running (a sync handler that did not return
    when cancelled; restart it); 130 a second signal.
    """
    from awp.worker.runtime import WorkerConfig, run_worker

    if ctx.invoked_subcommand is not None:  # awp worker list: the options above are a worker's, not used
        return
    if not bootstrap_token:
        raise click.UsageError(
            "the worker needs the registration token that `awp serve` was given: set AWP_WORKER_BOOTSTRAP_TOKEN "
            "(or pass --bootstrap-token)"
        )

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
        claim_on_complete=claim_on_complete if piggyback is None else piggyback,
        batch=batch,
        ca_file=ca_file,
    )
    sys.exit(run_worker(config))


# ---- awp workflow --------------------------------------------------------------------------------------------


@click.group()
def workflow() -> None:
    """Workflow definitions."""


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML that refuses a key given twice in one mapping (safe_load keeps the last one silently, where the HTTP
    API refuses duplicate JSON keys)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"the key {key!r} is given twice in one mapping", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    twice = sorted({k for k in keys if keys.count(k) > 1})
    if twice:
        raise ValueError(f"the key {twice[0]!r} is given twice in one object")
    return dict(pairs)


def load_definition(path: Path) -> dict[str, Any]:
    text = path.read_text(encoding="utf-8")
    try:
        if path.suffix.lower() == ".json":
            data = json.loads(text, object_pairs_hook=_unique_pairs)
        else:
            data = yaml.load(text, Loader=_UniqueKeyLoader)
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


def echo_columns(rows: Sequence[Sequence[str]]) -> None:
    """Plain aligned columns, never wrapped or cut (a rich table squeezes its columns to a pipe's 80)."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        click.echo("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())


@workflow.command("list")
@gateway_options
def workflow_list(client: Client, as_json: bool) -> None:
    """Every workflow with its latest version."""
    items = _run(_with(client, lambda c: c.list_workflows()))
    if as_json:
        _echo_json(items)
        return
    rows = [("workflow", "latest version", "created", "updated")]
    rows += [
        (str(w.get("workflow_id")), str(w.get("latest_version")), str(w.get("created_at")), str(w.get("updated_at")))
        for w in items
    ]
    echo_columns(rows)


@workflow.command("versions")
@click.argument("workflow_id")
@gateway_options
def workflow_versions(client: Client, as_json: bool, workflow_id: str) -> None:
    """The versions of WORKFLOW_ID, oldest first."""
    items = _run(_with(client, lambda c: c.workflow_versions(workflow_id)))
    if as_json:
        _echo_json(items)
        return
    rows = [("version", "tasks", "created", "definition hash")]
    rows += [
        (str(v.get("version")), str(v.get("task_count")), str(v.get("created_at")), str(v.get("definition_hash"))[:16])
        for v in items
    ]
    echo_columns(rows)


@workflow.command("show")
@click.argument("workflow_id")
@click.option("--version", type=click.IntRange(1), default=None, help="A version [default: the latest].")
@gateway_options
def workflow_show(client: Client, as_json: bool, workflow_id: str, version: int | None) -> None:
    """The definition of WORKFLOW_ID (its latest version, or --version N), as YAML (--json: the API's answer)."""

    async def go(c: Client) -> dict[str, Any]:
        v = version
        if v is None:
            v = int((await c.get_workflow(workflow_id))["latest_version"])
        return await c.get_workflow_version(workflow_id, v)

    answer = _run(_with(client, go))
    if as_json:
        _echo_json(answer)
        return
    click.echo(
        f"# workflow {answer.get('workflow_id')} version {answer.get('version')} ({answer.get('task_count')} tasks)"
    )
    click.echo(yaml.safe_dump(answer.get("definition"), sort_keys=False, allow_unicode=True).rstrip())


# ---- awp run ---------------------------------------------------------------------------------------------------


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
    run_input = _run_input(input_text, input_file)

    async def go(c: Client) -> tuple[dict[str, Any], str | None]:
        started = await c.start_run(workflow_id, version, idempotency_key, input=run_input, priority=priority)
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


def _run_input(text: str | None, path: Path | None, option: str = "--input") -> dict[str, Any] | None:
    """The run input of --input or --input-file (or another option's JSON object): a JSON object (a usage error
    otherwise), or None."""
    if text is not None and path is not None:
        raise click.UsageError("--input and --input-file are mutually exclusive")
    if path is not None:
        option = "--input-file"
        try:
            text = sys.stdin.read() if str(path) == "-" else path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise click.BadParameter(f"cannot read {path}: {e}", param_hint=option) from e
    elif text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError as e:
        raise click.BadParameter(f"not valid JSON: {e}", param_hint=option) from e
    if not isinstance(value, dict):
        kind = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(type(value), "a number")
        raise click.BadParameter(f"must be a JSON object, not {kind}", param_hint=option)
    return value


@run.command("list")
@click.option("--workflow", "workflow_id", default=None, help="Only runs of this workflow.")
@click.option("--status", type=click.Choice(["pending", "running", "succeeded", "failed", "canceled"]), default=None)
@click.option("--limit", type=click.IntRange(1, 10000), default=50, show_default=True, help="At most this many.")
@gateway_options
def run_list(client: Client, as_json: bool, workflow_id: str | None, status: str | None, limit: int) -> None:
    """Runs, newest first."""
    items = _run(_with(client, lambda c: c.list_runs(workflow_id, status, limit)))
    if as_json:
        _echo_json(items)
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

    info, tasks, failed, progress = _run(_with(client, go))
    if as_json:
        _echo_json({"run": info, "tasks": tasks, "progress": progress})
        return
    console = _console()
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

    task, names = _run(_with(client, go))
    if as_json:
        _echo_json(task)
        return
    console = _console()
    for line in task_lines(run_id, task, names, console.width):
        console.print(line, crop=False, soft_wrap=True)


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
    console = _console()
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
    _run(_with(client, lambda c: follow_logs(c, run_id, task_key, attempt, after, follow, as_json)))


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
    payload = _run_input(payload_text, None, option="--payload")
    answer = _run(_with(client, lambda c: c.send_signal(run_id, task_key, payload or {}, idempotency_key)))
    if as_json:
        _echo_json(answer)
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
    answer = _run(_with(client, lambda c: c.retry_run(run_id, list(task_keys) or None)))
    if as_json:
        _echo_json(answer)
    else:
        keys = answer.get("task_keys") or []
        click.echo(f"run {run_id} is {answer.get('status')} again: {len(keys)} task(s) to run ({', '.join(keys)})")


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


# ---- awp status ----------------------------------------------------------------------------------------------


@click.command("status")
@gateway_options
def status_cmd(client: Client, as_json: bool) -> None:
    """One screen of the cluster: workers and slots by executor kind, dispatches in flight against the limits,
    the oldest waiting task and why (docs/limits.md)."""
    answer = _run(_with(client, lambda c: c.cluster_status()))
    if as_json:
        _echo_json(answer)
        return
    console = _console()
    for line in status_lines(answer):
        console.print(line, crop=False, soft_wrap=True)


# ---- awp workers ---------------------------------------------------------------------------------------------


@click.command("workers")
@gateway_options
def workers_cmd(client: Client, as_json: bool) -> None:
    """The registered workers."""
    items = _run(_with(client, lambda c: c.list_workers()))
    if as_json:
        _echo_json(items)
        return
    _console().print(workers_table(items))


@worker.command("list")
@gateway_options
def worker_list(client: Client, as_json: bool) -> None:
    """The registered workers (as `awp workers`)."""
    items = _run(_with(client, lambda c: c.list_workers()))
    if as_json:
        _echo_json(items)
        return
    _console().print(workers_table(items))


@worker.command("drain")
@click.argument("worker_id")
@gateway_options
def worker_drain(client: Client, as_json: bool, worker_id: str) -> None:
    """Drain a worker (the operator token): it stops claiming at its next heartbeat, finishes its tasks within its
    --shutdown-timeout, gives back the rest (they run elsewhere, not counted as attempts) and ends stopped."""
    row = _run(_with(client, lambda c: c.drain_worker(worker_id)))
    if as_json:
        _echo_json(row)
        return
    click.echo(
        f"worker {row['worker_id']} ({row.get('display_name')}) is {row['status']}"
        f" with {row.get('active_leases', 0)} active lease(s)"
        + (": it drains at its next heartbeat" if row["status"] == "draining" else "")
    )


# ---- awp schedule --------------------------------------------------------------------------------------------


@click.group()
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
            f"schedule {answer['schedule_id']}: workflow {answer['workflow_id']} {schedule_trigger(answer)}; "
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
                schedule_trigger(s),
                str(s.get("next_fire_at") or "-"),
                str(s.get("last_fired_at") or "-"),
                str(s.get("last_run_id") or "-"),
            )
        )
    echo_columns(rows)


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


@click.group()
def limit() -> None:
    """Rate limits: at most N in flight and/or N starts per window, per limit name and key (docs/limits.md)."""


@limit.command("set")
@click.argument("name")
@click.option("--max-in-flight", type=click.IntRange(1), default=None, help="At most N queued + running tasks.")
@click.option("--per-window", type=click.IntRange(1), default=None, help="At most N attempt starts per window.")
@click.option("--window-ms", type=click.IntRange(1), default=None, help="The window of --per-window, in ms.")
@gateway_options
def limit_set(
    client: Client,
    as_json: bool,
    name: str,
    max_in_flight: int | None,
    per_window: int | None,
    window_ms: int | None,
) -> None:
    """Define or replace the limit NAME (tasks name it in their "limits")."""
    if max_in_flight is None and per_window is None:
        raise click.UsageError("give --max-in-flight, or --per-window with --window-ms (or both)")
    if (per_window is None) != (window_ms is None):
        raise click.UsageError("--per-window and --window-ms go together")
    answer = _run(
        _with(
            client,
            lambda c: c.set_limit(name, max_in_flight=max_in_flight, per_window=per_window, window_ms=window_ms),
        )
    )
    if as_json:
        _echo_json(answer)
    else:
        click.echo(f"limit {answer['name']}: {limit_rule(answer)}")


@limit.command("list")
@gateway_options
def limit_list(client: Client, as_json: bool) -> None:
    """Every limit with its tasks in flight and the ready tasks it holds back."""
    items = _run(_with(client, lambda c: c.list_limits()))
    if as_json:
        _echo_json(items)
        return
    rows = [("limit", "rule", "in flight", "held")]
    rows += [(str(x["name"]), limit_rule(x), str(x["in_flight"]), str(x["held"])) for x in items]
    echo_columns(rows)


@limit.command("delete")
@click.argument("name")
@gateway_options
def limit_delete(client: Client, as_json: bool, name: str) -> None:
    """Remove the limit NAME (the tasks naming it then wait until it is defined again)."""
    answer = _run(_with(client, lambda c: c.delete_limit(name)))
    if as_json:
        _echo_json(answer)
    else:
        click.echo(f"limit {name} deleted")


def limit_rule(x: dict[str, Any]) -> str:
    """A limit's rule for people: "at most 50 in flight, 100 starts per 1000 ms"."""
    parts = []
    if x.get("max_in_flight") is not None:
        parts.append(f"at most {x['max_in_flight']} in flight")
    if x.get("per_window") is not None:
        parts.append(f"{x['per_window']} starts per {x['window_ms']} ms")
    return ", ".join(parts)


# ---- rendering and watching ----------------------------------------------------------------------------------


# ---- awp demo --------------------------------------------------------------------------------------------------


@click.command()
@click.option(
    "--database-url",
    envvar="AWP_DATABASE_URL",
    default=None,
    help="Use this (superuser) database instead of the local cluster under .awp/.",
)
@click.option("--fast", is_flag=True, help="Shorter tasks and timings (for tests).")
@click.option("--port", type=int, default=0, help="Gateway port [default: a free one].")
@click.option("--workers", "n_workers", type=click.IntRange(2, 16), default=3, show_default=True)
@click.option(
    "--dynamic", is_flag=True, help="Run the dynamic example instead (for_each, when, a child run; docs/dynamic.md)."
)
def demo(database_url: str | None, fast: bool, port: int, n_workers: int, dynamic: bool) -> None:
    """Start the database, the gateway and workers; run the example DAG; kill a worker mid-run; show the takeover."""
    from awp.cli.demo import DemoError, run_demo

    try:
        code = run_demo(database_url=database_url, fast=fast, port=port, n_workers=n_workers, dynamic=dynamic)
    except DemoError as e:
        raise click.ClickException(str(e)) from e
    sys.exit(code)
