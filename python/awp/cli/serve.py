"""``awp serve``: the control plane's settings, from options and the environment, for
:func:`awp.server.serve.run_server`.

Database: ``--database-url`` / ``AWP_DATABASE_URL``, else the local cluster as the execute-only
``awp_gateway_login`` (:func:`awp.dev.localdb.gateway_database_url`).
"""

from __future__ import annotations

import errno
import ssl
from pathlib import Path

import click

from awp import eventloop
from awp.dev.localdb import ClusterError, gateway_database_url
from awp.server.appstate import (
    DEFAULT_BODY_TIMEOUT_MS,
    DEFAULT_HEAD_TIMEOUT_MS,
    DEFAULT_KEEPALIVE_TIMEOUT_MS,
    DEFAULT_STREAM_LIMIT,
    DEFAULT_STREAM_POLL_MS,
    MIN_TOKEN_LENGTH,
    GatewayConfig,
)
from awp.server.authfail import DEFAULT_MAX_DELAY_MS
from awp.server.grouping import DEFAULT_LANES, DEFAULT_LOCK_WAIT_MS
from awp.server.pools import DEFAULT_HEARTBEAT_POOL_SIZE, DEFAULT_LOCK_TIMEOUT_MS, DEFAULT_STATEMENT_TIMEOUT_MS
from awp.server.serve import run_server, server_ssl_context


@click.command()
@click.option("--host", envvar="AWP_HOST", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", envvar="AWP_PORT", type=int, default=8080, show_default=True, help="Port to listen on.")
@click.option(
    "--database-url",
    envvar="AWP_DATABASE_URL",
    default=None,
    help="PostgreSQL DSN of a member of awp_gateway [default: the local cluster's awp_gateway_login].",
)
@click.option(
    "--direct-database-url",
    envvar="AWP_DIRECT_DATABASE_URL",
    default=None,
    help="DSN of the coordinator's and the LISTEN connection's own sessions, past a connection pooler "
    "[default: --database-url].",
)
@click.option(
    "--shard-url",
    "shard_urls",
    multiple=True,
    help="Behind a PL/Proxy router (--database-url is the router's; docs/scale-out.md): a shard's DSN for its "
    "coordinator and LISTEN sessions; once per shard, in any order.",
)
@click.option(
    "--pgbouncer",
    envvar="AWP_PGBOUNCER",
    is_flag=True,
    help="--database-url goes through PgBouncer in transaction pooling mode: no prepared statements, no startup "
    "options (docs/operations.md, Behind PgBouncer); needs --direct-database-url (or --shard-url).",
)
@click.option(
    "--tls-cert",
    envvar="AWP_TLS_CERT",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="Serve HTTPS with this PEM certificate (chain); needs --tls-key.",
)
@click.option(
    "--tls-key",
    envvar="AWP_TLS_KEY",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="The PEM private key of --tls-cert.",
)
@click.option("--no-coordinator", is_flag=True, help="Run the gateway only (no standby coordinator).")
@click.option(
    "--coordinator-interval-ms",
    envvar="AWP_COORDINATOR_INTERVAL_MS",
    type=click.IntRange(10, 3_600_000),
    default=1000,
    show_default=True,
    help="Period of coordinator passes (and of a standby's leadership checks, at most 1 s) besides NOTIFY "
    "wake-ups. The leader lease (how long a silent leader keeps the lead) is the database setting "
    "leader_lease_ms: SELECT awp.configure(leader_lease_ms => ...).",
)
@click.option(
    "--retention-interval-ms",
    envvar="AWP_RETENTION_INTERVAL_MS",
    type=click.IntRange(100, 3_600_000),
    default=5000,
    show_default=True,
    help="Period of the active coordinator's retention batches (awp.apply_retention; docs/retention.md).",
)
@click.option("--viewer-token", envvar="AWP_VIEWER_TOKEN", default="", help="Secret for read routes.")
@click.option("--operator-token", envvar="AWP_OPERATOR_TOKEN", default="", help="Secret for read and write routes.")
@click.option(
    "--bootstrap-token", envvar="AWP_WORKER_BOOTSTRAP_TOKEN", default="", help="Secret for worker registration."
)
@click.option("--metrics-token", envvar="AWP_METRICS_TOKEN", default=None, help="Require this bearer on /metrics.")
@click.option(
    "--pool-size",
    envvar="AWP_POOL_SIZE",
    type=click.IntRange(1, 1000),
    default=10,
    show_default=True,
    help="Database connections for requests (every route but the ones of --heartbeat-pool-size).",
)
@click.option(
    "--heartbeat-pool-size",
    envvar="AWP_HEARTBEAT_POOL_SIZE",
    type=click.IntRange(1, 100),
    default=DEFAULT_HEARTBEAT_POOL_SIZE,
    show_default=True,
    help="Database connections of their own for heartbeats, registrations, drains and /health/ready.",
)
@click.option(
    "--lock-timeout-ms",
    envvar="AWP_LOCK_TIMEOUT_MS",
    type=click.IntRange(1, 3_600_000),
    default=DEFAULT_LOCK_TIMEOUT_MS,
    show_default=True,
    help="lock_timeout of every request connection: a request waiting longer for a lock answers 503 (retryable).",
)
@click.option(
    "--group-lock-wait-ms",
    envvar="AWP_GROUP_LOCK_WAIT_MS",
    type=click.IntRange(1, 3_600_000),
    default=DEFAULT_LOCK_WAIT_MS,
    show_default=True,
    help="How long a grouped completion call waits for a lock (at most --lock-timeout-ms) before its completions"
    " go run by run: a stuck run must not hold back the others.",
)
@click.option(
    "--group-lanes",
    envvar="AWP_GROUP_LANES",
    type=click.IntRange(1, 1000),
    default=DEFAULT_LANES,
    show_default=True,
    help="Grouped completion calls in flight at once (at most --pool-size), each for its share of the runs.",
)
@click.option(
    "--statement-timeout-ms",
    envvar="AWP_STATEMENT_TIMEOUT_MS",
    type=click.IntRange(1, 86_400_000),
    default=DEFAULT_STATEMENT_TIMEOUT_MS,
    show_default=True,
    help="statement_timeout of every request connection: a longer statement is canceled and answers 503.",
)
@click.option(
    "--claim-recheck-ms",
    envvar="AWP_CLAIM_RECHECK_MS",
    type=click.IntRange(10, 60_000),
    default=500,
    show_default=True,
    help="How often a long-polling claim re-checks the database besides NOTIFY wake-ups.",
)
@click.option(
    "--head-timeout-ms",
    envvar="AWP_HEAD_TIMEOUT_MS",
    type=click.IntRange(100, 3_600_000),
    default=DEFAULT_HEAD_TIMEOUT_MS,
    show_default=True,
    help="A connection whose request head has not all arrived this long after it opened (or after the head's first"
    " byte on a kept-alive connection) is closed without an answer.",
)
@click.option(
    "--body-timeout-ms",
    envvar="AWP_BODY_TIMEOUT_MS",
    type=click.IntRange(100, 3_600_000),
    default=DEFAULT_BODY_TIMEOUT_MS,
    show_default=True,
    help="A request body not all arrived this long after its head answers 408 request_timeout; the connection closes.",
)
@click.option(
    "--keepalive-timeout-ms",
    envvar="AWP_KEEPALIVE_TIMEOUT_MS",
    type=click.IntRange(100, 3_600_000),
    default=DEFAULT_KEEPALIVE_TIMEOUT_MS,
    show_default=True,
    help="A kept-alive connection idle this long between requests is closed.",
)
@click.option(
    "--auth-backoff-max-ms",
    envvar="AWP_AUTH_BACKOFF_MAX_MS",
    type=click.IntRange(0, 60_000),
    default=DEFAULT_MAX_DELAY_MS,
    show_default=True,
    help="The longest delay of a 401 answer to a source that keeps failing authentication (0: no delay).",
)
@click.option(
    "--stream-limit",
    envvar="AWP_STREAM_LIMIT",
    type=click.IntRange(0, 100_000),
    default=DEFAULT_STREAM_LIMIT,
    show_default=True,
    help="Open GET /runs/{id}/stream event streams this gateway serves at most; beyond it 503 + Retry-After.",
)
@click.option(
    "--stream-poll-ms",
    envvar="AWP_STREAM_POLL_MS",
    type=click.IntRange(10, 60_000),
    default=DEFAULT_STREAM_POLL_MS,
    show_default=True,
    help="How often an event stream reads the database for news (at once for writes this gateway accepted).",
)
@click.option("--shutdown-timeout", type=float, default=10.0, show_default=True, help="Seconds to finish requests.")
def serve(
    host: str,
    port: int,
    database_url: str | None,
    direct_database_url: str | None,
    shard_urls: tuple[str, ...],
    pgbouncer: bool,
    tls_cert: Path | None,
    tls_key: Path | None,
    no_coordinator: bool,
    coordinator_interval_ms: int,
    retention_interval_ms: int,
    viewer_token: str,
    operator_token: str,
    bootstrap_token: str,
    metrics_token: str | None,
    pool_size: int,
    heartbeat_pool_size: int,
    lock_timeout_ms: int,
    group_lock_wait_ms: int,
    group_lanes: int,
    statement_timeout_ms: int,
    claim_recheck_ms: int,
    head_timeout_ms: int,
    body_timeout_ms: int,
    keepalive_timeout_ms: int,
    auth_backoff_max_ms: int,
    stream_limit: int,
    stream_poll_ms: int,
    shutdown_timeout: float,
) -> None:
    """Run the control plane: the HTTP gateway and a (standby) coordinator."""
    ssl_context = None
    if (tls_cert is None) != (tls_key is None):
        raise click.UsageError("--tls-cert and --tls-key go together (AWP_TLS_CERT, AWP_TLS_KEY)")
    if tls_cert is not None and tls_key is not None:
        try:
            ssl_context = server_ssl_context(tls_cert, tls_key)
        except (ssl.SSLError, OSError) as e:
            raise click.UsageError(f"cannot use --tls-cert {tls_cert} / --tls-key {tls_key}: {e}") from None
    if not database_url:
        try:
            database_url = gateway_database_url()
        except ClusterError as e:
            raise click.UsageError(str(e)) from None
    if pgbouncer and not (direct_database_url or shard_urls):
        raise click.UsageError(
            "--pgbouncer needs --direct-database-url (AWP_DIRECT_DATABASE_URL): the coordinator holds a session "
            "advisory lock and the gateway LISTENs, which transaction pooling cannot keep"
        )
    if shard_urls and direct_database_url:
        raise click.UsageError(
            "--shard-url and --direct-database-url exclude each other: behind a router each "
            "shard's coordinator and LISTEN sessions use that shard's --shard-url"
        )
    config = GatewayConfig(
        database_url=database_url,
        direct_database_url=direct_database_url or None,
        shard_urls=tuple(shard_urls),
        pgbouncer=pgbouncer,
        viewer_token=viewer_token,
        operator_token=operator_token,
        bootstrap_token=bootstrap_token,
        metrics_token=metrics_token or None,
        pool_size=pool_size,
        heartbeat_pool_size=heartbeat_pool_size,
        lock_timeout_ms=lock_timeout_ms,
        group_lock_wait_ms=group_lock_wait_ms,
        group_lanes=group_lanes,
        statement_timeout_ms=statement_timeout_ms,
        coordinator=not no_coordinator,
        coordinator_interval_ms=coordinator_interval_ms,
        claim_recheck_ms=claim_recheck_ms,
        retention_interval_ms=retention_interval_ms,
        head_timeout_ms=head_timeout_ms,
        body_timeout_ms=body_timeout_ms,
        keepalive_timeout_ms=keepalive_timeout_ms,
        auth_backoff_max_ms=auth_backoff_max_ms,
        stream_limit=stream_limit,
        stream_poll_ms=stream_poll_ms,
    )
    if group_lanes > pool_size:
        raise click.BadParameter("at most --pool-size (a lane's call takes a connection)", param_hint="--group-lanes")
    try:
        config.check()
    except ValueError as e:
        raise click.UsageError(
            f"{e}: set AWP_VIEWER_TOKEN, AWP_OPERATOR_TOKEN and AWP_WORKER_BOOTSTRAP_TOKEN "
            "(or --viewer-token, --operator-token, --bootstrap-token) to three different secrets "
            f"of at least {MIN_TOKEN_LENGTH} characters"
        ) from None
    try:
        eventloop.run(run_server(config, host, port, shutdown_timeout, ssl_context))
    except OSError as e:  # binding the port: in use (EADDRINUSE), not allowed, no such address
        if e.errno not in (errno.EADDRINUSE, errno.EACCES, errno.EADDRNOTAVAIL):
            raise
        hint = {
            errno.EADDRINUSE: f"another process listens on port {port}: stop it, or choose --port (AWP_PORT)",
            errno.EACCES: f"port {port} needs privileges: choose a port above 1023 with --port (AWP_PORT)",
            errno.EADDRNOTAVAIL: f"{host} is not an address of this machine: choose --host (AWP_HOST)",
        }[e.errno]
        raise click.ClickException(f"cannot listen on {host}:{port}: {e.strerror} ({hint})") from None
