"""AWP's test kit: what the tests, the benchmarks and the development tools share, kept out of the runtime
(no module of :mod:`awp` imports this package; ``python/tests/unit/test_import_graph.py`` checks it).

- :mod:`awp_testing.cluster`: throwaway PostgreSQL clusters, fresh migrated databases, ``pg_prove``
  (``python -m awp_testing pgprove db/tests`` is ``make test-db``);
- :mod:`awp_testing.gateway`: a real ``awp serve`` process on a free port (:func:`~awp_testing.gateway.serve`),
  its tokens and headers;
- :mod:`awp_testing.mutate`: mutation testing of ``db/functions`` (``python -m awp_testing.mutate``, ``make mutate``);
- :mod:`awp_testing.sqldoc`: generates ``docs/sql-api.md`` (``python -m awp_testing.sqldoc``, ``make docs``).
"""
