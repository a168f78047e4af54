"""What a gateway login's own session holds cannot change what AWP's functions do (AWP issue 44).

Attacks as a real login that is a member of ``awp_gateway`` (EXECUTE on the public functions only), each on a
fresh connection so PL/pgSQL compiles the functions in the attacker's session:

- a type shadowed in ``pg_temp`` (a domain ``pg_temp.jsonb`` whose CHECK calls the attacker's function) was looked
  up by every SECURITY DEFINER function (``SET search_path = ''`` searches pg_temp first for types), so the
  attacker's code ran as ``awp_owner``. Now TEMPORARY is refused (migration 0012), and even with it granted the
  pinned ``search_path = pg_catalog, pg_temp`` finds pg_catalog's types first;
- a forged ``awp.log_state`` (a call's run counters) written before a call, or after it and committed, wrote
  another run's counters; now no function reads a caller's value and nothing flushes at commit.
"""

from __future__ import annotations

import psycopg
import pytest
from psycopg import sql
from psycopg.types.json import Jsonb
from worker_support import Workers, apply, mock_task, start_run, wait_run

from awp_testing.gateway import serve, wait_until

# Every type name the functions declare or cast to, shadowed by a domain whose CHECK raises when it runs as
# awp_owner (a SECURITY DEFINER function's identity): the attack of the finding, with the evidence in its error.
SHADOWED_TYPES = ["jsonb", "text", "int4", "int8", "bool", "timestamptz", "bytea", "xid8", "uuid"]
TRAP = """
CREATE FUNCTION pg_temp.trap() RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
  IF current_user = 'awp_owner' THEN
    RAISE EXCEPTION 'TRAP: attacker code ran as %', current_user;
  END IF;
  RETURN true;
END $$
"""


def admin(dsn: str, query: sql.Composed | str, params: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(query, params)
        return cur.fetchall() if cur.description else []


def role_of(dsn: str) -> str:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT current_user").fetchone()
        assert row is not None
        return str(row[0])


def definition(workflow_id: str, n: int = 2) -> Jsonb:
    tasks = [{"key": f"t{i}", "executor": "mock", **({"depends_on": [f"t{i - 1}"]} if i else {})} for i in range(n)]
    return Jsonb({"id": workflow_id, "tasks": tasks})


def run_counters(dsn: str, run_id: str) -> tuple[object, ...]:
    rows = admin(dsn, "SELECT revision, last_sequence, unfinished_tasks FROM awp.runs WHERE run_id = %s", (run_id,))
    return rows[0]


def test_temporary_objects_are_refused_to_the_gateway_login(db_dsn: str, gateway_login: str) -> None:
    assert admin(db_dsn, "SELECT has_database_privilege('public', current_database(), 'TEMPORARY')") == [(False,)]
    with psycopg.connect(gateway_login, autocommit=True) as conn:
        for statement in ("CREATE TEMP TABLE t (x int)", "CREATE DOMAIN pg_temp.jsonb AS pg_catalog.jsonb"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="temporary"):
                conn.execute(statement)
        # and the login still does its job
        row = conn.execute("SELECT awp.cluster_status() IS NOT NULL").fetchone()
        assert row == (True,)


def test_shadowing_types_operators_and_functions_in_pg_temp_changes_nothing(db_dsn: str, gateway_login: str) -> None:
    role = role_of(gateway_login)
    grant = sql.SQL("GRANT TEMPORARY ON DATABASE {} TO {}")
    database = sql.Identifier(str(admin(db_dsn, "SELECT current_database()")[0][0]))
    admin(db_dsn, grant.format(database, sql.Identifier(role)))
    try:
        with psycopg.connect(gateway_login, autocommit=True) as conn:
            conn.execute(TRAP)
            for name in SHADOWED_TYPES:
                conn.execute(f"CREATE DOMAIN pg_temp.{name} AS pg_catalog.{name} CHECK (pg_temp.trap())")
            # Functions and operators: PostgreSQL never looks them up in pg_temp, pinned or not; here to prove it.
            conn.execute(
                "CREATE FUNCTION pg_temp.jsonb_typeof(pg_catalog.jsonb) RETURNS pg_catalog.text"
                " LANGUAGE sql AS $$ SELECT CASE WHEN pg_temp.trap() THEN 'object' END $$"
            )
            conn.execute(
                "CREATE FUNCTION pg_temp.eq(pg_catalog.text, pg_catalog.text) RETURNS pg_catalog.bool"
                " LANGUAGE sql AS $$ SELECT pg_temp.trap() $$"
            )
            conn.execute(
                "CREATE OPERATOR pg_temp.= (LEFTARG = pg_catalog.text, RIGHTARG = pg_catalog.text,"
                " FUNCTION = pg_temp.eq)"
            )
            # The five functions of the finding, each compiled in this session with the shadows in place.
            created = conn.execute("SELECT workflow_id FROM awp.create_workflow_version(%s)",
                                   (definition("shadowed"),)).fetchone()  # fmt: skip
            assert created == ("shadowed",)
            status = conn.execute("SELECT awp.cluster_status()").fetchone()
            assert status is not None and isinstance(status[0], dict)
            register = "SELECT worker_id, session_token FROM awp.register_worker('w', '{mock}', 2)"
            worker = conn.execute(register).fetchone()
            assert worker is not None
            run = conn.execute("SELECT awp.start_run('shadowed')").fetchone()
            assert run is not None and str(run[0]).startswith("run_")
            beats = conn.execute("SELECT count(*) FROM awp.heartbeat(%s, %s, '[]'::pg_catalog.jsonb)",
                                 (worker[0], worker[1])).fetchone()  # fmt: skip
            assert beats == (0,)
            conn.execute("SELECT awp.coordinator_tick()")
            claimed = conn.execute("SELECT count(*) FROM awp.claim_tasks(%s, %s, 1)", (worker[0], worker[1])).fetchone()
            assert claimed == (1,)
    finally:
        admin(db_dsn, sql.SQL("REVOKE TEMPORARY ON DATABASE {} FROM {}").format(database, sql.Identifier(role)))
    assert admin(db_dsn, "SELECT count(*) FROM awp.check_invariants()") == [(0,)]


def test_a_forged_log_state_before_or_after_a_call_writes_no_run(db_dsn: str, gateway_login: str) -> None:
    with psycopg.connect(gateway_login, autocommit=True) as conn:
        conn.execute("SELECT awp.create_workflow_version(%s)", (definition("forged", 3),))
        victim = conn.execute("SELECT awp.start_run('forged')").fetchone()
        target = conn.execute("SELECT awp.start_run('forged')").fetchone()
        assert victim is not None and target is not None
    victim_id, target_id = str(victim[0]), str(target[0])
    before = run_counters(db_dsn, victim_id)
    forged = f";{victim_id},999,999,50"

    # one transaction: forged before the call, and again after it, committed
    with psycopg.connect(gateway_login) as conn:
        conn.execute("SELECT set_config('awp.log_state', %s, true)", (forged,))
        conn.execute("SELECT awp.request_cancel(%s)", (target_id,))
        conn.execute("SELECT set_config('awp.log_state', %s, true)", (forged,))
        conn.commit()
    assert run_counters(db_dsn, victim_id) == before, "the victim run's counters were written"

    with psycopg.connect(gateway_login, autocommit=True) as conn:  # the coordinator's passes go on, the victim runs on
        for _ in range(3):
            row = conn.execute("SELECT awp.coordinator_tick()").fetchone()
            assert row is not None and "isolated" not in row[0], row
    rows = admin(db_dsn, "SELECT run_id, status FROM awp.runs WHERE run_id IN (%s, %s)", (victim_id, target_id))
    statuses = {str(run_id): str(status) for run_id, status in rows}
    assert statuses[target_id] == "canceled" and statuses[victim_id] in ("pending", "running"), statuses
    assert admin(db_dsn, "SELECT count(*) FROM awp.check_invariants()") == [(0,)]
    triggers = "SELECT count(*) FROM pg_trigger WHERE tgrelid = 'awp.events'::regclass AND NOT tgisinternal"
    assert admin(db_dsn, triggers) == [(0,)], "a trigger on awp.events would run at commit, after the call"


def test_a_bad_run_does_not_stop_the_coordinator(db_dsn: str) -> None:
    """A run whose counters are broken (its next event collides with events_pkey) used to fail every pass, so
    nobody's retries were promoted. Now the pass runs again run by run, skips it, and the gateway logs it."""
    with serve(db_dsn, coordinator_interval_ms=100) as gw:
        bad = start_run(gw, apply(gw, {"id": "bad", "tasks": [mock_task("b1")]}))  # no worker yet: stays pending
        admin(db_dsn, "UPDATE awp.runs SET last_sequence = 0, cancel_requested_at = now() WHERE run_id = %s", (bad,))
        with Workers(gw) as workers:
            workers.start("w1")
            # a1 fails once; only a coordinator pass promotes its retry.
            good = start_run(gw, apply(gw, {"id": "good", "tasks": [mock_task("a1", max_attempts=2, fail_attempts=1)]}))
            assert wait_run(gw, good)["status"] == "succeeded"
            wait_until(
                lambda: f"run {bad} skipped in cancel convergence" in gw.log_tail(400), 10, 0.1, "the skip logged"
            )
            assert gw.log_tail(400).count(f"run {bad} skipped in cancel convergence") == 1, "logged once a minute"
            admin(db_dsn, "UPDATE awp.runs SET last_sequence = (SELECT max(sequence) FROM awp.events e"
                          " WHERE e.run_id = %s) WHERE run_id = %s", (bad, bad))  # fmt: skip
            assert wait_run(gw, bad)["status"] == "canceled"
    assert admin(db_dsn, "SELECT count(*) FROM awp.check_invariants()") == [(0,)]
