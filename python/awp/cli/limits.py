"""``awp limit set|list|delete``: rate limits, at most N in flight and/or N starts per window (docs/limits.md)."""

from __future__ import annotations

from typing import Any

import click

from awp.cli.user import echo_columns, echo_json, gateway_options, run_call, with_client
from awp.worker.client import Client


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
    answer = run_call(
        with_client(
            client,
            lambda c: c.set_limit(name, max_in_flight=max_in_flight, per_window=per_window, window_ms=window_ms),
        )
    )
    if as_json:
        echo_json(answer)
    else:
        click.echo(f"limit {answer['name']}: {limit_rule(answer)}")


@limit.command("list")
@gateway_options
def limit_list(client: Client, as_json: bool) -> None:
    """Every limit with its tasks in flight and the ready tasks it holds back."""
    items = run_call(with_client(client, lambda c: c.list_limits()))
    if as_json:
        echo_json(items)
        return
    rows = [("limit", "rule", "in flight", "held")]
    rows += [(str(x["name"]), limit_rule(x), str(x["in_flight"]), str(x["held"])) for x in items]
    echo_columns(rows)


@limit.command("delete")
@click.argument("name")
@gateway_options
def limit_delete(client: Client, as_json: bool, name: str) -> None:
    """Remove the limit NAME (the tasks naming it then wait until it is defined again)."""
    answer = run_call(with_client(client, lambda c: c.delete_limit(name)))
    if as_json:
        echo_json(answer)
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
