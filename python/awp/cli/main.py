"""The ``awp`` command: the ``main`` click group, the ``db`` and ``check`` commands, and the registration of
every other command. Command modules (:mod:`awp.cli.serve`, :mod:`awp.cli.workers`, :mod:`awp.cli.workflows`,
:mod:`awp.cli.runs`, :mod:`awp.cli.schedules`, :mod:`awp.cli.limits`, :mod:`awp.cli.retention`, :mod:`awp.cli.user`)
define plain click commands and do not import this module; the list at the bottom adds them, so the import graph
has no cycle. A new command: define it with ``@click.command()`` in its module and add it to ``COMMANDS``."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import click
import psycopg

from awp import __version__
from awp.cli import limits as cli_limits
from awp.cli import retention as cli_retention
from awp.cli import router as cli_router
from awp.cli import runs as cli_runs
from awp.cli import schedules as cli_schedules
from awp.cli import serve
from awp.cli import user as cli_user
from awp.cli import workers as cli_workers
from awp.cli import workflows as cli_workflows
from awp.dev.localdb import (
    DEFAULT_DBNAME,
    GATEWAY_LOGIN,
    ClusterError,
    default_database_url,
    find_project_dir,
    gateway_database_url,
    gateway_passfile,
    project_cluster,
    purge_project_cluster,
    up_project_database,
)
from awp.dev.migrate import MigrationError, migrate
from awp.dev.pgbin import PostgresNotFound
from awp.logsafe import SafeFormatter

_EXTERNAL = "AWP_DATABASE_URL is set: using that server; the local cluster is not touched."


@click.group()
@click.version_option(__version__, prog_name="awp")
@click.option("-v", "--verbose", count=True, help="Debug log output.")
def main(verbose: int) -> None:
    """AWP: a PostgreSQL-centred runtime and scheduler for multi-step workflows."""
    level = logging.DEBUG if verbose else logging.INFO
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(SafeFormatter("%(levelname)s %(name)s: %(message)s"))  # one line per record (logsafe)
    logging.basicConfig(level=level, handlers=[handler])
    # The format above uses no thread, process or caller fields: skip gathering them for every record (the
    # gateway logs one line per request). The Logging HOWTO's "Optimization" table names these four settings as
    # the way to do it, _srcfile (the caller's frame) included: there is no public one for it.
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    logging._srcfile = None


@main.group()
@click.option(
    "--project-dir",
    type=click.Path(file_okay=False, path_type=Path),
    envvar="AWP_PROJECT_DIR",
    default=None,
    help="Project whose .awp/ holds the local cluster [default: nearest dir with .awp/, else cwd].",
)
@click.pass_context
def db(ctx: click.Context, project_dir: Path | None) -> None:
    """The database: a local cluster under .awp/ (port AWP_DB_PORT, default 54329), or AWP_DATABASE_URL."""
    ctx.obj = (project_dir or find_project_dir()).absolute()


def _fail(message: str) -> None:
    raise click.ClickException(message)


@db.command()
@click.option("--migrate/--no-migrate", "run_migrate", default=True, help="Apply db/ after starting.")
@click.pass_obj
def up(project_dir: Path, run_migrate: bool) -> None:
    """Create (first time) and start the local cluster, create database 'awp' and the gateway's login.

    TCP logins need a password (scram-sha-256); `awp serve` logs in as awp_gateway_login, whose password
    is kept in .awp/gateway.pgpass (mode 0600). Prints the gateway's DSN, then the superuser's (unix socket,
    for migrations and psql) on the last line.
    """
    if os.environ.get("AWP_DATABASE_URL"):
        click.echo(_EXTERNAL)
        return
    try:
        local = up_project_database(project_dir, run_migrate=run_migrate)
    except (ClusterError, PostgresNotFound, MigrationError, FileNotFoundError, psycopg.Error) as e:
        _fail(str(e))
    if run_migrate:
        click.echo(f"migrations applied: {', '.join(local.applied) or 'none (up to date)'}", err=True)
    click.echo(f"gateway (awp serve): {local.gateway_dsn}")
    click.echo(local.admin_dsn)


@db.command()
@click.option("--purge", is_flag=True, help="Also delete the cluster's data.")
@click.pass_obj
def down(project_dir: Path, purge: bool) -> None:
    """Stop the local cluster (data is kept unless --purge)."""
    if os.environ.get("AWP_DATABASE_URL"):
        click.echo(_EXTERNAL)
        return
    try:
        if purge:
            purge_project_cluster(project_dir)
            click.echo("stopped; data deleted")
            return
        cluster = project_cluster(project_dir)
        was_running = cluster.status().running
        cluster.stop()
    except (ClusterError, PostgresNotFound) as e:
        _fail(str(e))
    click.echo("stopped" if was_running else "not running")


@db.command()
@click.pass_obj
def status(project_dir: Path) -> None:
    """Show whether the database is reachable (exit 1 when it is not)."""
    url = os.environ.get("AWP_DATABASE_URL")
    if url:
        try:
            with psycopg.connect(url, connect_timeout=5) as conn:
                version = conn.execute("SHOW server_version").fetchone()
        except psycopg.Error as e:
            _fail(f"AWP_DATABASE_URL is not reachable: {e}")
        click.echo(f"external server (AWP_DATABASE_URL) reachable, PostgreSQL {version[0] if version else '?'}")
        return
    try:
        cluster = project_cluster(project_dir)
        st = cluster.status()
    except (ClusterError, PostgresNotFound) as e:
        _fail(str(e))
    click.echo(f"data:    {cluster.datadir}")
    if st.running:
        state = f"running (pid {st.pid})"
    else:
        state = "stopped" if st.initialized else "not created (run: awp db up)"
    click.echo(f"state:   {state}")
    click.echo(f"dsn:     {cluster.dsn(DEFAULT_DBNAME)}  (superuser postgres, unix socket)")
    passfile = gateway_passfile(project_dir)
    if passfile.exists():
        click.echo(f"gateway: {cluster.tcp_dsn(DEFAULT_DBNAME, GATEWAY_LOGIN, passfile)}")
    else:
        click.echo("gateway: no login yet (run: awp db up)")
    if not st.running:
        sys.exit(1)


@db.command()
@click.option("--gateway", "for_gateway", is_flag=True, help="The gateway login's DSN (what awp serve uses).")
@click.pass_obj
def dsn(project_dir: Path, for_gateway: bool) -> None:
    """Print the local cluster's DSN of database awp: the superuser's (unix socket), or with --gateway
    awp_gateway_login's (TCP, password in .awp/gateway.pgpass). E.g. psql "$(awp db dsn)"."""
    try:
        url = gateway_database_url(project_dir) if for_gateway else default_database_url(project_dir)
    except ClusterError as e:
        _fail(str(e))
    click.echo(url)


@db.command("migrate")
@click.option("--database-url", envvar="AWP_DATABASE_URL", default=None, help="[default: the local cluster's]")
@click.option("--sql-dir", type=click.Path(file_okay=False, path_type=Path), envvar="AWP_SQL_DIR", default=None)
@click.option("--with-pgtap", is_flag=True, hidden=True)
@click.pass_obj
def migrate_cmd(project_dir: Path, database_url: str | None, sql_dir: Path | None, with_pgtap: bool) -> None:
    """Apply new migrations and re-apply every function file."""
    dsn = database_url or default_database_url(project_dir)
    try:
        applied = migrate(dsn, sql_dir=sql_dir, with_pgtap=with_pgtap)
    except (MigrationError, FileNotFoundError, psycopg.Error, RuntimeError) as e:
        _fail(str(e))
    click.echo(f"migrations applied: {', '.join(applied) or 'none (up to date)'}")


@main.command()
@click.argument("run_ids", nargs=-1)
@click.option("--database-url", envvar="AWP_DATABASE_URL", default=None, help="[default: the local cluster's]")
def check(run_ids: tuple[str, ...], database_url: str | None) -> None:
    """Check the invariants of RUN_IDS (all runs when none): prints every violation, exit 1 if any."""
    dsn = database_url or default_database_url(find_project_dir())
    try:
        with psycopg.connect(dsn) as conn:
            unknown = conn.execute(
                "SELECT coalesce(array_agg(u ORDER BY u), '{}') FROM unnest(%s::text[]) u"
                " WHERE NOT EXISTS (SELECT 1 FROM awp.runs r WHERE r.run_id = u)",
                [list(run_ids)],
            ).fetchone()
            if unknown and unknown[0]:
                _fail(f"no such run: {', '.join(unknown[0])} (`awp run list` shows the runs)")
            rows = conn.execute("SELECT * FROM awp.check_invariants(%s)", [list(run_ids) or None]).fetchall()
    except psycopg.Error as e:
        _fail(str(e))
    for invariant, run_id, key, detail in rows:
        click.echo(f"{invariant}\trun={run_id or '-'}\t{key or '-'}\t{detail}")
    click.echo(f"{len(rows)} violation(s)")
    if rows:
        sys.exit(1)


COMMANDS: tuple[click.Command, ...] = (
    serve.serve,
    cli_workers.worker,
    cli_workflows.workflow,
    cli_runs.run,
    cli_user.status_cmd,
    cli_workers.workers_cmd,
    cli_schedules.schedule,
    cli_limits.limit,
    cli_retention.prune,
    cli_user.demo,
    cli_router.router,
)
for _command in COMMANDS:
    main.add_command(_command)
