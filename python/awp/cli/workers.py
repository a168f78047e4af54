"""``awp worker`` (run a worker; ``worker list``, ``worker drain WORKER_ID``) and ``awp workers`` (the registered
workers). The worker itself talks to the gateway with the bootstrap token; the lists and the drain with the operator
(or viewer) token, as every command of :mod:`awp.cli.user`."""

from __future__ import annotations

import logging
import sys

import click

from awp.cli.terminal import workers_table
from awp.cli.user import (
    DEFAULT_GATEWAY,
    ca_file_option,
    echo_json,
    gateway_options,
    report_console,
    run_call,
    with_client,
)
from awp.worker.client import Client


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


@click.command("workers")
@gateway_options
def workers_cmd(client: Client, as_json: bool) -> None:
    """The registered workers."""
    items = run_call(with_client(client, lambda c: c.list_workers()))
    if as_json:
        echo_json(items)
        return
    report_console().print(workers_table(items))


@worker.command("list")
@gateway_options
def worker_list(client: Client, as_json: bool) -> None:
    """The registered workers (as `awp workers`)."""
    items = run_call(with_client(client, lambda c: c.list_workers()))
    if as_json:
        echo_json(items)
        return
    report_console().print(workers_table(items))


@worker.command("drain")
@click.argument("worker_id")
@gateway_options
def worker_drain(client: Client, as_json: bool, worker_id: str) -> None:
    """Drain a worker (the operator token): it stops claiming at its next heartbeat, finishes its tasks within its
    --shutdown-timeout, gives back the rest (they run elsewhere, not counted as attempts) and ends stopped."""
    row = run_call(with_client(client, lambda c: c.drain_worker(worker_id)))
    if as_json:
        echo_json(row)
        return
    click.echo(
        f"worker {row['worker_id']} ({row.get('display_name')}) is {row['status']}"
        f" with {row.get('active_leases', 0)} active lease(s)"
        + (": it drains at its next heartbeat" if row["status"] == "draining" else "")
    )
