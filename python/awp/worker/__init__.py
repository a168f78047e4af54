"""A worker, ``awp worker``: the gateway's HTTP client, the leases it holds, the executors that run them and the
live output they send (docs/protocol.md). Never imports the server or the CLI."""
