"""``awp router``: a PL/Proxy router in front of several AWP databases (docs/scale-out.md; python/awp/dev/router.py)."""

from __future__ import annotations

from pathlib import Path

import click
import psycopg

from awp.dev import router as router_setup
from awp.dev.migrate import MigrationError

_SQL_DIR = click.option(
    "--sql-dir", type=click.Path(file_okay=False, path_type=Path), envvar="AWP_SQL_DIR", default=None, hidden=True
)


@click.group()
def router() -> None:
    """Shard runs over several PostgreSQL databases behind a PL/Proxy router (docs/scale-out.md)."""


@router.command("init")
@click.option("--router-url", required=True, help="A superuser's DSN of the router's database (PL/Proxy installed).")
@click.option(
    "--shard-url",
    "shard_urls",
    multiple=True,
    required=True,
    help="A superuser's DSN of a shard's database, once per shard: shard 0 first. Each is migrated.",
)
@_SQL_DIR
def init_cmd(router_url: str, shard_urls: tuple[str, ...], sql_dir: Path | None) -> None:
    """Make the shards (migrated, numbered, with a login for the router) and the router in front of them.
    Only for shards that hold no run yet (a shard's number is in its run ids); run again after an upgrade of the
    shards (`awp db migrate` of each) to regenerate the router's functions."""
    try:
        connstrs = router_setup.init(router_url, list(shard_urls), sql_dir)
    except (MigrationError, ValueError, psycopg.Error) as e:
        raise click.ClickException(str(e)) from None
    click.echo(f"router ready: {len(connstrs)} shards")


@router.command("add-shard")
@click.option("--router-url", required=True, help="A superuser's DSN of the router's database.")
@click.option("--shard-url", required=True, help="A superuser's DSN of the new shard's (empty) database.")
@_SQL_DIR
def add_shard_cmd(router_url: str, shard_url: str, sql_dir: Path | None) -> None:
    """Add a shard: it takes new runs from now on; existing runs stay on their shards. Copies the workflows (every
    version, in order), settings, rate limits and live worker sessions from shard 0."""
    try:
        index = router_setup.add_shard(router_url, shard_url, sql_dir)
    except (MigrationError, ValueError, psycopg.Error) as e:
        raise click.ClickException(str(e)) from None
    click.echo(f"shard {index} added")


@router.command("sql")
@click.option("--shard-url", required=True, help="A DSN of a migrated shard: its catalog gives the signatures.")
def sql_cmd(shard_url: str) -> None:
    """Print the router's generated proxy functions (the part of the router made from a shard's catalog)."""
    try:
        with psycopg.connect(shard_url) as conn:
            click.echo(router_setup.proxies_sql(conn), nl=False)
    except (ValueError, psycopg.Error) as e:
        raise click.ClickException(str(e)) from None
