"""The control plane, ``awp serve``: the HTTP gateway (routes, middleware, auth, grouping of completions), the
database layer, the coordinator and the dashboard (docs/architecture.md). Never imports the worker or the CLI."""
