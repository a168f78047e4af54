"""What the people-facing commands of ``awp`` share, and the two commands of no noun: ``status`` and ``demo``.

The others are by noun: ``worker`` and ``workers`` (:mod:`awp.cli.workers`), ``workflow`` (:mod:`awp.cli.workflows`),
``run`` (:mod:`awp.cli.runs`), ``schedule`` (:mod:`awp.cli.schedules`) and ``limit`` (:mod:`awp.cli.limits`).
Everything but ``worker`` talks to the gateway with the operator (or viewer) token, so it works from any
machine: ``--gateway`` / ``AWP_GATEWAY_URL`` and ``--token`` / ``AWP_OPERATOR_TOKEN`` (:func:`gateway_options`).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from functools import wraps
from pathlib import Path
from typing import Any, TypeVar

import click
from rich.console import Console

from awp import eventloop
from awp.cli.terminal import status_lines
from awp.worker.client import Client, ClientError, GatewayError, TlsVerifyError, TransportError

DEFAULT_GATEWAY = "http://127.0.0.1:8080"

T = TypeVar("T")


# What to do about an error, by the gateway's error code: each CLI error names its fix (AWP issue 41).
FIXES = {
    "unauthorized": "set AWP_OPERATOR_TOKEN (or --token) to the operator token `awp serve` was given",
    "forbidden": "this needs the operator token: set AWP_OPERATOR_TOKEN (or --token), not the viewer's",
    "unavailable": "the gateway cannot reach its database: start it with `awp db up` (or check awp serve's "
    "AWP_DATABASE_URL), then try again",
}


def run_call(coro: Coroutine[Any, Any, T]) -> T:
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


def report_console() -> Console:
    """A console for a command's report: when stdout is not a terminal (a pipe, a file) and COLUMNS does not say a
    width, tables are as wide as their content instead of cut to rich's default 80 columns (AWP issue 41)."""
    if sys.stdout.isatty() or os.environ.get("COLUMNS"):
        return Console(highlight=False)
    return Console(highlight=False, width=1000)


def echo_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=False, default=str))


async def with_client(client: Client, call: Callable[[Client], Awaitable[T]]) -> T:
    async with client:
        return await call(client)


def echo_columns(rows: Sequence[Sequence[str]]) -> None:
    """Plain aligned columns, never wrapped or cut (a rich table squeezes its columns to a pipe's 80)."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        click.echo("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())


def input_object(text: str | None, path: Path | None, option: str = "--input") -> dict[str, Any] | None:
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


# ---- awp status ----------------------------------------------------------------------------------------------


@click.command("status")
@gateway_options
def status_cmd(client: Client, as_json: bool) -> None:
    """One screen of the cluster: workers and slots by executor kind, dispatches in flight against the limits,
    the oldest waiting task and why (docs/limits.md)."""
    answer = run_call(with_client(client, lambda c: c.cluster_status()))
    if as_json:
        echo_json(answer)
        return
    console = report_console()
    for line in status_lines(answer):
        console.print(line, crop=False, soft_wrap=True)


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
