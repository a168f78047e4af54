"""The PL/Proxy router's SQL (issue 43, part 3; db/router/, python/awp/dev/router.py; docs/scale-out.md), on a
router cluster and two shard clusters of their own: every public function routed with the shard's signature, runs
spread over the shards and found again by id, the worker protocol across shards (one worker on every shard, claims,
heartbeats, batches split and put back in order, fencing), merged lists, the SQLSTATEs of the shards, the router's
own privileges, and adding a shard."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from shard_support import Sharded, sharded

from awp.dev import router as router_setup
from awp.server.errors import from_database_error

pytestmark = pytest.mark.slow

WORKFLOW = {"id": "routed", "tasks": [{"key": "a", "executor": "mock"}, {"key": "b", "executor": "mock"}]}


@pytest.fixture(scope="module")
def env() -> Iterator[Sharded]:
    with sharded(2) as e:
        with psycopg.connect(e.router_admin, autocommit=True) as c:
            c.execute("SELECT * FROM awp.apply_workflow(%s)", (Jsonb(WORKFLOW),))
        yield e


def q(dsn: str, sql: str, params: Any = ()) -> list[dict[str, Any]]:
    with psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as c:
        cur = c.execute(sql, params)
        return cur.fetchall() if cur.description else []


def shard_of(run_or_dispatch_id: str) -> int:
    return int(run_or_dispatch_id[17:19], 16)


def tick(env: Sharded) -> None:
    """A coordinator pass on each shard (no gateway runs here): runs start, dispatches are made."""
    for d in env.shard_admins:
        q(d, "SELECT awp.coordinator_tick()")


def start_runs(env: Sharded, n: int) -> list[str]:
    return [
        r["id"] for r in q(env.router_gateway, "SELECT awp.start_run('routed') AS id FROM generate_series(1, %s)", (n,))
    ]


def test_every_public_function_is_routed_with_the_shards_signature(env: Sharded) -> None:
    sig = (
        "SELECT p.proname AS name, pg_get_function_identity_arguments(p.oid) AS args,"
        " pg_get_function_result(p.oid) AS result FROM pg_proc p"
        " WHERE p.pronamespace = 'awp'::regnamespace AND p.proname !~ '^_' ORDER BY 1, 2"
    )
    shard = {(r["name"], r["args"]): r["result"] for r in q(env.shard_admins[0], sig)}
    router = {(r["name"], r["args"]): r["result"] for r in q(env.router_admin, sig)}
    assert {name for name, _ in shard} <= set(router_setup.RULES), "a public function without a router rule"
    expected = {k: v for k, v in shard.items() if router_setup.RULES[k[0]] != "shard"}
    assert router == expected
    assert any(rule == "shard" for rule in router_setup.RULES.values())


def test_the_gateway_login_runs_the_awp_functions_and_reads_nothing_else(env: Sharded) -> None:
    assert q(env.router_gateway, "SELECT awp.get_settings() AS s")[0]["s"]["lease_duration_ms"] > 0
    for sql in (
        "SELECT * FROM awp_router.shards",
        "SELECT * FROM awp_shard.get_settings(0)",
        "SELECT * FROM plproxy.get_cluster_partitions('awp')",
    ):
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            q(env.router_gateway, sql)


def test_the_router_logs_in_to_each_shard_with_the_gateways_lock_timeout(env: Sharded) -> None:
    for d in env.shard_admins:
        config = q(d, "SELECT rolconfig FROM pg_roles WHERE rolname = 'awp_router_login'")[0]["rolconfig"]
        assert f"lock_timeout={router_setup.ROUTER_LOCK_TIMEOUT}" in config


def test_runs_spread_over_the_shards_and_are_found_by_id(env: Sharded) -> None:
    ids = start_runs(env, 40)
    shards = [shard_of(i) for i in ids]
    assert set(shards) == {0, 1} and min(shards.count(0), shards.count(1)) >= 8, shards
    for i in ids[:6]:
        assert q(env.shard_admins[shard_of(i)], "SELECT 1 FROM awp.runs WHERE run_id = %s", (i,))
        assert q(env.router_gateway, "SELECT status FROM awp.get_run(%s)", (i,))[0]["status"] in ("pending", "running")
        assert len(q(env.router_gateway, "SELECT * FROM awp.run_tasks(%s)", (i,))) == 2
    # a keyed start goes to its key's shard every time: the retry finds the run
    key = f"k-{uuid.uuid4()}"
    first = q(env.router_gateway, "SELECT awp.start_run('routed', NULL, %s) AS id", (key,))[0]["id"]
    again = q(env.router_gateway, "SELECT awp.start_run('routed', NULL, %s) AS id", (key,))[0]["id"]
    assert first == again
    # a batch goes whole to one shard (all or nothing there): the shard of its first item's key
    items = [{"idempotency_key": f"b-{uuid.uuid4()}"} for _ in range(5)]
    batch = q(env.router_gateway, "SELECT * FROM awp.start_runs('routed', NULL, %s)", (Jsonb(items),))
    assert len(batch) == 5 and len({shard_of(r["run_id"]) for r in batch}) == 1
    with pytest.raises(psycopg.Error) as e:  # one bad item: nothing starts
        q(env.router_gateway, "SELECT * FROM awp.start_runs('routed', NULL, %s)", (Jsonb([{}, {"priority": 99}]),))
    assert e.value.sqlstate == "AWREQ"


def test_the_shards_sqlstates_come_through(env: Sharded) -> None:
    with pytest.raises(psycopg.Error) as e:
        q(env.router_gateway, "SELECT * FROM awp.get_run('run_t0000000000000000000000000000000')")
    assert e.value.sqlstate == "AWNTF"
    with pytest.raises(psycopg.Error) as e:
        q(env.router_gateway, "SELECT * FROM awp.get_run('nonsense')")
    assert e.value.sqlstate == "AWNTF"
    with pytest.raises(psycopg.Error) as e:  # a malformed list goes whole to shard 0, which refuses it
        q(env.router_gateway, "SELECT * FROM awp.heartbeat('wkr_x', 'tok', '{\"not\": \"a list\"}')")
    assert e.value.sqlstate in ("AWSES", "AWREQ")


def test_one_worker_serves_both_shards_and_is_fenced_on_each(env: Sharded) -> None:
    g = env.router_gateway
    w = q(g, "SELECT * FROM awp.register_worker('both', '{mock}', 8)")[0]
    wid, tok = w["worker_id"], w["session_token"]
    for d in env.shard_admins:  # the same session on every shard
        assert q(d, "SELECT status FROM awp.workers WHERE worker_id = %s", (wid,))[0]["status"] == "active"
    start_runs(env, 12)
    tick(env)
    leases: list[dict[str, Any]] = []
    for _ in range(60):  # each claim starts at a shard at random and takes what it finds there first
        leases += q(g, "SELECT * FROM awp.claim_tasks(%s, %s, 1, 1)", (wid, tok))
        if len(leases) >= 8 and {shard_of(x["dispatch_id"]) for x in leases} == {0, 1}:
            break
    leases = leases[:8] if {shard_of(x["dispatch_id"]) for x in leases[:8]} == {0, 1} else leases[-8:]
    assert len(leases) == 8 and {shard_of(x["dispatch_id"]) for x in leases} == {0, 1}, leases
    held = q(g, "SELECT active_leases FROM awp.get_worker(%s)", (wid,))[0]["active_leases"]
    assert held >= 8  # summed over both shards
    refs = [{"dispatch_id": x["dispatch_id"], "lease_token": x["lease_token"]} for x in leases]
    forged = [*refs[:3], {"dispatch_id": refs[3]["dispatch_id"], "lease_token": "wrong"}, *refs[4:]]
    beat = q(g, "SELECT * FROM awp.heartbeat(%s, %s, %s, 1, '{}')", (wid, tok, Jsonb(forged)))
    assert [b["dispatch_id"] for b in beat] == [r["dispatch_id"] for r in refs]  # in the order given
    assert [b["status"] for b in beat] == ["renewed"] * 3 + ["unknown"] + ["renewed"] * 4
    # fencing: a wrong lease token on either shard is lease_lost, and writes nothing
    for ref in (next(r for r in refs if shard_of(r["dispatch_id"]) == s) for s in (0, 1)):
        with pytest.raises(psycopg.Error) as e:
            q(
                g,
                "SELECT awp.complete_task(%s, %s, %s, 'forged', '{\"kind\": \"success\"}')",
                (wid, tok, ref["dispatch_id"]),
            )
        assert e.value.sqlstate == "AWLST"
    # progress from both shards in one call: one row per item, in order
    items = [{**r, "logs": [f"line {i}"]} for i, r in enumerate(refs[:4])]
    rows = q(g, "SELECT * FROM awp.report_progress_many(%s, %s, %s)", (wid, tok, Jsonb(items)))
    assert [r["dispatch_id"] for r in rows] == [r["dispatch_id"] for r in refs[:4]]
    assert all(r["error"] is None for r in rows)
    # results from both shards in one call, answered in order, slots refilled from either
    results = [{**r, "result": {"kind": "success", "output": {"i": i}}} for i, r in enumerate(refs[:6])]
    answer = q(g, "SELECT awp.complete_tasks(%s, %s, %s, 2, 2) AS a", (wid, tok, Jsonb(results)))[0]["a"]
    assert [x["dispatch_id"] for x in answer["results"]] == [r["dispatch_id"] for r in refs[:6]]
    assert all(x.get("applied") for x in answer["results"]), answer["results"]
    assert len(answer["leases"]) == 2
    # claim on complete for two items of two shards in one call
    rest = refs[6:]
    many = [
        {"worker_id": wid, "session_token": tok, **r, "result": {"kind": "success"}, "slots": 1, "claim_seq": 3}
        for r in rest
    ]
    got = q(g, "SELECT g.item, g.error, (g.lease).dispatch_id FROM awp.complete_and_claim_many(%s) g", (Jsonb(many),))
    assert {r["item"] for r in got} == {1, 2} and all(r["error"] is None for r in got), got
    for d in env.shard_admins:
        assert q(d, "SELECT * FROM awp.check_invariants()") == []
    # limits: set on every shard, read with what every shard holds
    q(g, "SELECT * FROM awp.set_limit('api', 5, NULL, NULL)")
    for d in env.shard_admins:
        assert q(d, "SELECT max_in_flight FROM awp.get_limit('api')")[0]["max_in_flight"] == 5
    assert q(g, "SELECT in_flight FROM awp.get_limit('api')")[0]["in_flight"] == 0
    assert [r["name"] for r in q(g, "SELECT name FROM awp.list_limits()")] == ["api"]
    with pytest.raises(psycopg.Error) as e:
        q(g, "SELECT * FROM awp.get_limit('nope')")
    assert e.value.sqlstate == "AWNTF"
    # a worker's own drain and an operator's reach every shard
    other = q(g, "SELECT * FROM awp.register_worker('other', '{mock}', 1)")[0]
    q(g, "SELECT * FROM awp.drain_worker(%s, %s)", (other["worker_id"], other["session_token"]))
    for d in env.shard_admins:
        assert (
            q(d, "SELECT status FROM awp.workers WHERE worker_id = %s", (other["worker_id"],))[0]["status"] == "stopped"
        )
    q(g, "SELECT * FROM awp.request_drain(%s)", (wid,))
    for d in env.shard_admins:
        assert q(d, "SELECT status FROM awp.workers WHERE worker_id = %s", (wid,))[0]["status"] in (
            "draining",
            "stopped",
        )


def test_lists_merge_the_shards_newest_first_and_page(env: Sharded) -> None:
    start_runs(env, 10)
    everything = [
        r["run_id"] for r in q(env.router_gateway, "SELECT run_id FROM awp.list_runs(NULL, NULL, NULL, 1000)")
    ]
    on_shards = {r["run_id"] for d in env.shard_admins for r in q(d, "SELECT run_id FROM awp.runs")}
    assert set(everything) == on_shards and len(everything) == len(on_shards)
    paged: list[str] = []
    after = None
    while True:
        page = q(env.router_gateway, "SELECT run_id FROM awp.list_runs(NULL, NULL, %s, 7)", (after,))
        paged += [r["run_id"] for r in page]
        if len(page) < 7:
            break
        after = page[-1]["run_id"]
    assert paged == everything
    metrics = q(env.router_gateway, "SELECT awp.metrics_snapshot() AS m")[0]["m"]
    assert metrics == metrics  # a JSON object merged from both shards
    status = q(env.router_gateway, "SELECT awp.cluster_status() AS s")[0]["s"]
    assert isinstance(status, dict)


def test_a_shard_added_takes_new_runs_and_the_old_ones_stay(env: Sharded) -> None:
    before = start_runs(env, 4)
    # the new shard is a database in shard 1's cluster (the router's login there is shared)
    with psycopg.connect(env.shard_admins[1], autocommit=True) as c:
        c.execute("CREATE DATABASE awp_third")
    info = psycopg.conninfo.conninfo_to_dict(env.shard_admins[1])
    third = psycopg.conninfo.make_conninfo(
        **{**{k: str(v) for k, v in info.items() if v is not None}, "dbname": "awp_third"}
    )
    assert router_setup.add_shard(env.router_admin, third) == 2
    assert q(third, "SELECT count(*)::int AS n FROM awp.workflow_versions")[0]["n"] >= 1
    ids = start_runs(env, 30)
    assert 2 in {shard_of(i) for i in ids}
    for i in before + ids[:5]:
        assert q(env.router_gateway, "SELECT status FROM awp.get_run(%s)", (i,))[0]["status"] in ("pending", "running")
    assert len(q(env.router_gateway, "SELECT * FROM awp.check_invariants()")) == 0


def test_with_a_shard_down_the_others_serve_claims_and_heartbeats(env: Sharded) -> None:
    """Last in this module: it stops shard 1's cluster (and so shard 2 of the test before, in the same cluster)."""
    g = env.router_gateway
    # Leases that outlive the outage: on a busy machine the test once took 15.8 s, more than the default lease (15 s),
    # and the lease of the shard that was down came back revoked (expired), not renewed.
    for admin in env.shard_admins:
        q(admin, "SELECT awp.configure(lease_duration_ms => 120000)")
    w = q(g, "SELECT * FROM awp.register_worker('survivor', '{mock}', 200)")[0]
    wid, tok = w["worker_id"], w["session_token"]
    tick(env)
    held: dict[int, dict[str, Any]] = {}
    for _ in range(60):  # a lease from each of shards 0 and 1
        for lease in q(g, "SELECT * FROM awp.claim_tasks(%s, %s, 1, 1)", (wid, tok)):
            held.setdefault(shard_of(lease["dispatch_id"]), lease)
        if {0, 1} <= set(held):
            break
    assert {0, 1} <= set(held), held
    down_run = held[1]["run_id"]
    q(env.shard_admins[1], "CHECKPOINT")  # the throwaway clusters commit asynchronously: keep the claims above
    env.shard_clusters[1].stop(mode="immediate")
    try:
        refs = [{"dispatch_id": held[s]["dispatch_id"], "lease_token": held[s]["lease_token"]} for s in (0, 1)]
        for _ in range(10):  # claims never fail for the shard that is down, whichever shard they try first
            for lease in q(g, "SELECT * FROM awp.claim_tasks(%s, %s, 1, 2)", (wid, tok)):
                assert shard_of(lease["dispatch_id"]) == 0
            beat = q(g, "SELECT * FROM awp.heartbeat(%s, %s, %s)", (wid, tok, Jsonb(refs)))
            assert [(b["dispatch_id"], b["status"]) for b in beat] == [(refs[0]["dispatch_id"], "renewed")]
        with pytest.raises(psycopg.Error) as e:  # what lives on that shard: unavailable (the gateway: 503)
            q(g, "SELECT * FROM awp.get_run(%s)", (down_run,))
        api_error = from_database_error(e.value)
        assert api_error is not None and api_error.status == 503, e.value
        q(env.shard_admins[0], "CHECKPOINT")
        env.shard_clusters[0].stop(mode="immediate")  # every shard down: claims and heartbeats fail (503)
        try:
            for sql, args in (
                ("SELECT * FROM awp.claim_tasks(%s, %s, 1, 3)", (wid, tok)),
                ("SELECT * FROM awp.heartbeat(%s, %s, %s)", (wid, tok, Jsonb(refs))),
            ):
                with pytest.raises(psycopg.Error) as e:
                    q(g, sql, args)
                api_error = from_database_error(e.value)
                assert api_error is not None and api_error.status == 503, e.value
        finally:
            env.shard_clusters[0].start()
    finally:
        env.shard_clusters[1].start()
    assert q(g, "SELECT status FROM awp.get_run(%s)", (down_run,))[0]["status"] == "running"
    beat = q(g, "SELECT * FROM awp.heartbeat(%s, %s, %s)", (wid, tok, Jsonb(refs)))
    assert [b["status"] for b in beat] == ["renewed", "renewed"]
