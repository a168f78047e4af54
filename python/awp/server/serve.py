"""The control plane (HTTP gateway + coordinator) as one process: :func:`run_server`; the ``awp serve`` command
(:mod:`awp.cli.serve`) reads its settings.

Graceful shutdown on SIGTERM/SIGINT: stop accepting connections, end long-polls (they answer an
empty lease list), finish in-flight requests, stop the coordinator (releasing its advisory lock),
close the pools.

TLS: ``--tls-cert FILE --tls-key FILE`` (PEM) serve HTTPS only; workers and the CLI then use an ``https://``
gateway URL and ``--ca-file`` (or the system's trust store). The database URL comes from the command.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import ssl
from pathlib import Path

from aiohttp import web

from awp.server.app import create_app
from awp.server.appstate import (
    GatewayConfig,
)
from awp.server.webserver import GatewayRunner

log = logging.getLogger("awp.serve")  # the log's name, not the module's (docs/operations.md, Logs)


def server_ssl_context(cert_file: Path, key_file: Path) -> ssl.SSLContext:
    """A server TLS context (TLS 1.2 or later) for the PEM certificate chain ``cert_file`` and its key."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert_file, key_file)
    return context


async def run_server(
    config: GatewayConfig,
    host: str,
    port: int,
    shutdown_timeout: float = 10.0,
    ssl_context: ssl.SSLContext | None = None,
) -> None:
    """Serve until SIGTERM or SIGINT, then shut down gracefully; HTTPS when ``ssl_context`` is given."""
    app = create_app(config)
    runner = GatewayRunner(app, access_log=None, handle_signals=False, shutdown_timeout=shutdown_timeout)
    await runner.setup()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        site = web.TCPSite(runner, host, port, reuse_address=True, ssl_context=ssl_context)
        await site.start()
        bound = list(runner.addresses) or [(host, port)]
        scheme = "https" if ssl_context else "http"
        log.info(
            "awp serve listening on %s (coordinator %s)",
            ", ".join(f"{scheme}://{a[0]}:{a[1]}" for a in bound),
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
