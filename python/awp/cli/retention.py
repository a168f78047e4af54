"""``awp prune``: delete what is older than a duration (docs/retention.md), with ``awp.prune`` on the database.

Like ``awp check`` it talks to the database directly (``--database-url`` / ``AWP_DATABASE_URL``, else the local
cluster): pruning is a DBA's operation, not an API call. ``awp.prune`` works in bounded batches for about two
seconds per call; the command calls it again while it says there is ``more``, and prints the totals.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import time
from typing import Any

import click
import psycopg

from awp.dev.localdb import default_database_url, find_project_dir

_PART = re.compile(r"(\d+)(ms|s|m|h|d|w)")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}
COUNTS = ("runs", "tasks", "dispatches", "attempts", "events", "workers", "idempotency_keys")


def parse_duration(text: str) -> dt.timedelta:
    """``30s``, ``15m``, ``12h``, ``7d``, ``2w``, ``500ms`` or a sum of them (``1d12h``); ValueError otherwise."""
    compact = text.strip().lower().replace(" ", "")
    if not compact or _PART.sub("", compact):
        raise ValueError(f"{text!r} is not a duration: use e.g. 30s, 15m, 12h, 7d (or 1d12h)")
    ms = sum(int(n) * _UNIT_MS[unit] for n, unit in _PART.findall(compact))
    if ms > 100 * 365 * 86_400_000:
        raise ValueError(f"{text!r} is more than 100 years")
    return dt.timedelta(milliseconds=ms)


class Duration(click.ParamType):
    name = "duration"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> dt.timedelta:
        if isinstance(value, dt.timedelta):
            return value
        try:
            return parse_duration(str(value))
        except ValueError as e:
            self.fail(str(e), param, ctx)


@click.command()
@click.option(
    "--older-than",
    "older_than",
    type=Duration(),
    required=True,
    metavar="DURATION",
    help="Delete what finished, ended or was recorded longer ago: 30s, 15m, 12h, 7d, 1d12h.",
)
@click.option("--database-url", envvar="AWP_DATABASE_URL", default=None, help="[default: the local cluster's]")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON output (the totals).")
def prune(older_than: dt.timedelta, database_url: str | None, as_json: bool) -> None:
    """Delete finished runs (with their tasks, dispatches, attempts and events), ended worker sessions nothing
    references any more, and idempotency records older than --older-than. Pending and running runs, active and
    draining workers are never touched. Safe on a live system: bounded batches, short locks."""
    dsn = database_url or default_database_url(find_project_dir())
    totals = dict.fromkeys(COUNTS, 0)
    calls = batches = 0
    cutoff: Any = None
    started = time.monotonic()
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            while True:
                row = conn.execute("SELECT awp.prune(%s)", (older_than,)).fetchone()
                answer: dict[str, Any] = row[0] if row else {}
                calls += 1
                batches += int(answer.get("batches") or 0)
                cutoff = cutoff or answer.get("cutoff")
                for key in COUNTS:
                    totals[key] += int(answer.get(key) or 0)
                if not answer.get("more"):
                    break
    except psycopg.Error as e:
        raise click.ClickException(str(e).strip()) from e
    elapsed = time.monotonic() - started
    if as_json:
        summary = {**totals, "cutoff": cutoff, "calls": calls, "batches": batches, "seconds": round(elapsed, 3)}
        click.echo(json.dumps(summary, indent=2))
        return
    click.echo(
        f"pruned {totals['runs']} runs ({totals['tasks']} tasks, {totals['dispatches']} dispatches, "
        f"{totals['attempts']} attempts, {totals['events']} events), {totals['workers']} worker session"
        f"{'s' if totals['workers'] != 1 else ''}, {totals['idempotency_keys']} idempotency keys; "
        f"cutoff {cutoff}; {batches} batch{'es' if batches != 1 else ''}, {elapsed:.2f}s"
    )
