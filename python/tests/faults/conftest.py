"""Fixtures of the fault tests that stop PostgreSQL (the shared ones are python/tests/conftest.py's).

- ``cluster`` (module): a throwaway cluster of the module's own (``fault_support.own_cluster``), never the session's:
  its tests stop it, restart it and terminate its backends.
- ``dsn`` (function): a fresh migrated database of its own per test on ``cluster`` (synchronous_commit on), started
  again first if a test left the cluster stopped (``fault_support.stoppable_database``).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fault_support import own_cluster, stoppable_database

from awp.dev.localdb import Cluster


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with own_cluster() as c:
        yield c


@pytest.fixture
def dsn(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    with stoppable_database(cluster, "fault_" + request.node.name.removeprefix("test_")) as dsn:
        yield dsn
