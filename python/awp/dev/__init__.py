"""Local development: the local PostgreSQL cluster (``.awp/``), migrations, PostgreSQL binaries and child
processes. Imports nothing of the server, the worker or the CLI."""
