"""``awp serve``: the control plane (HTTP gateway + coordinator) as one process.

Graceful shutdown on SIGTERM/SIGINT: stop accepting connections, end long-polls (they answer an
empty lease list), finish in-flight requests, stop the coordinator (releasing its advisory lock),
close the pools.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal

import click
from aiohttp import web

from awp.app import create_app
from awp.appstate import GatewayConfig
from awp.cli import main

log = logging.getLogger(__name__)


async def run_server(config: GatewayConfig, host: str, port: int, shutdown_timeout: float = 10.0) -> None:
    """Serve until SIGTERM or SIGINT, then shut down gracefully."""
    app = create_app(config)
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=shutdown_timeout)
    await runner.setup()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        site = web.TCPSite(runner, host, port, reuse_address=True)
        await site.start()
        bound = list(runner.addresses) or [(host, port)]
        log.info(
            "awp serve listening on %s (coordinator %s)",
            ", ".join(f"http://{a[0]}:{a[1]}" for a in bound),
            f"every {config.coordinator_interval_ms} ms" if config.coordinator else "disabled",
        )
        await stop.wait()
        log.info("shutting down")
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(Exception):
                loop.remove_signal_handler(sig)
        await runner.cleanup()
    log.info("stopped")


@main.command()
@click.option("--host", envvar="AWP_HOST", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", envvar="AWP_PORT", type=int, default=8080, show_default=True, help="Port to listen on.")
@click.option(
    "--database-url", envvar="AWP_DATABASE_URL", default=None, help="PostgreSQL DSN [default: the local cluster's]."
)
@click.option("--no-coordinator", is_flag=True, help="Run the gateway only (no standby coordinator).")
@click.option(
    "--coordinator-interval-ms",
    envvar="AWP_COORDINATOR_INTERVAL_MS",
    type=click.IntRange(10, 3_600_000),
    default=1000,
    show_default=True,
    help="Period of coordinator passes (and of a standby's lock retries, at most 1 s) besides NOTIFY wake-ups.",
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
@click.option("--pool-size", envvar="AWP_POOL_SIZE", type=click.IntRange(1, 1000), default=10, show_default=True)
@click.option(
    "--claim-recheck-ms",
    envvar="AWP_CLAIM_RECHECK_MS",
    type=click.IntRange(10, 60_000),
    default=500,
    show_default=True,
    help="How often a long-polling claim re-checks the database besides NOTIFY wake-ups.",
)
@click.option("--shutdown-timeout", type=float, default=10.0, show_default=True, help="Seconds to finish requests.")
def serve(
    host: str,
    port: int,
    database_url: str | None,
    no_coordinator: bool,
    coordinator_interval_ms: int,
    retention_interval_ms: int,
    viewer_token: str,
    operator_token: str,
    bootstrap_token: str,
    metrics_token: str | None,
    pool_size: int,
    claim_recheck_ms: int,
    shutdown_timeout: float,
) -> None:
    """Run the control plane: the HTTP gateway and a (standby) coordinator."""
    if not database_url:
        from awp.localdb import default_database_url

        database_url = default_database_url()
    config = GatewayConfig(
        database_url=database_url,
        viewer_token=viewer_token,
        operator_token=operator_token,
        bootstrap_token=bootstrap_token,
        metrics_token=metrics_token or None,
        pool_size=pool_size,
        coordinator=not no_coordinator,
        coordinator_interval_ms=coordinator_interval_ms,
        claim_recheck_ms=claim_recheck_ms,
        retention_interval_ms=retention_interval_ms,
    )
    try:
        config.check()
    except ValueError as e:
        raise click.UsageError(
            f"{e}: set AWP_VIEWER_TOKEN, AWP_OPERATOR_TOKEN and AWP_WORKER_BOOTSTRAP_TOKEN "
            "(or --viewer-token, --operator-token, --bootstrap-token) to three different secrets"
        ) from None
    asyncio.run(run_server(config, host, port, shutdown_timeout))
