"""``awp schedule create|list|delete``: start runs of a workflow on a cron expression or every N ms
(docs/schedules.md)."""

from __future__ import annotations

from pathlib import Path

import click

from awp.cli.terminal import schedule_trigger
from awp.cli.user import echo_columns, echo_json, gateway_options, input_object, run_call, with_client
from awp.worker.client import Client


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
    schedule_input = input_object(input_text, input_file)
    answer = run_call(
        with_client(
            client,
            lambda c: c.create_schedule(
                schedule_id, workflow_id, cron=cron, interval_ms=every_ms, input=schedule_input, timezone=timezone
            ),
        )
    )
    if as_json:
        echo_json(answer)
    else:
        click.echo(
            f"schedule {answer['schedule_id']}: workflow {answer['workflow_id']} {schedule_trigger(answer)}; "
            f"next fire at {answer.get('next_fire_at')}"
        )


@schedule.command("list")
@gateway_options
def schedule_list(client: Client, as_json: bool) -> None:
    """Every schedule with its next and last fire times."""
    items = run_call(with_client(client, lambda c: c.list_schedules()))
    if as_json:
        echo_json(items)
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
    answer = run_call(with_client(client, lambda c: c.delete_schedule(schedule_id)))
    if as_json:
        echo_json(answer)
    else:
        click.echo(f"schedule {answer.get('schedule_id', schedule_id)} deleted")
