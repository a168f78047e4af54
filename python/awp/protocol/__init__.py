"""What the worker and the gateway agree on over HTTP (docs/protocol.md): the JSON codec, the result of an attempt
and its limits, run and task statuses, the wire types and every wire limit. Imports nothing else of :mod:`awp`."""
