"""Shards behind a PL/Proxy router for the tests (docs/scale-out.md): :func:`sharded` starts a router cluster and
shard clusters of their own (throwaway, trust authentication) and sets them up as ``awp router init`` does."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import psycopg

from awp.dev import router as router_setup
from awp.dev.localdb import Cluster
from awp_testing.cluster import local_cluster

GATEWAY_LOGIN = "awp_gateway_login"


@dataclass
class Sharded:
    router_admin: str  # superuser DSNs
    shard_admins: list[str]
    router_gateway: str  # the gateway login's DSNs (a member of awp_gateway)
    shard_gateways: list[str]
    shard_clusters: list[Cluster]  # to stop and start a shard


def _gateway_login(admin_dsn: str) -> str:
    """The execute-only gateway login on the cluster of ``admin_dsn`` (trust authentication: a throwaway cluster)."""
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (GATEWAY_LOGIN,)).fetchone():
            conn.execute(f"CREATE ROLE {GATEWAY_LOGIN} LOGIN IN ROLE awp_gateway")
    return psycopg.conninfo.make_conninfo(admin_dsn, user=GATEWAY_LOGIN)


@contextlib.contextmanager
def sharded(shards: int = 2) -> Iterator[Sharded]:
    """A router cluster and ``shards`` shard clusters, set up by ``awp router init`` (python/awp/dev/router.py)."""
    with contextlib.ExitStack() as stack:
        clusters = [stack.enter_context(local_cluster(prefix=f"awp-shard{i}-")) for i in range(shards + 1)]
        dsns = [c.create_database("awp") for c in clusters]
        router_admin, shard_admins = dsns[0], dsns[1:]
        router_setup.init(router_admin, shard_admins)
        yield Sharded(
            router_admin,
            shard_admins,
            _gateway_login(router_admin),
            [_gateway_login(d) for d in shard_admins],
            clusters[1:],
        )
